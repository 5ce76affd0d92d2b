// Rank-aware logging. Only rank 0 prints informational lines unless asked otherwise; every
// line printed by a rank other than 0, and every error, carries the rank so a multi-rank log
// can be read. The process context (src/dist) sets the rank once at start-up.
#pragma once

#include <string>

#include "core/error.hpp"

namespace hpc::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3, Quiet = 4 };

void set_rank(int rank, int world_size);
void set_level(Level level);
Level level();
int rank();

void write(Level level, const std::string& line);

template <class... Args>
void info(const Args&... args) { write(Level::Info, detail::concat(args...)); }
template <class... Args>
void warn(const Args&... args) { write(Level::Warn, detail::concat(args...)); }
template <class... Args>
void error(const Args&... args) { write(Level::Error, detail::concat(args...)); }
template <class... Args>
void debug(const Args&... args) { write(Level::Debug, detail::concat(args...)); }

}  // namespace hpc::log
