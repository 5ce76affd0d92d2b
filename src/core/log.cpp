#include "core/log.hpp"

#include <cstdio>
#include <mutex>

namespace hpc::log {
namespace {
int g_rank = 0;
int g_world = 1;
Level g_level = Level::Info;
std::mutex g_mutex;  // lines from the loader thread and the main thread must not interleave
}  // namespace

void set_rank(int rank, int world_size) { g_rank = rank; g_world = world_size; }
void set_level(Level level) { g_level = level; }
Level level() { return g_level; }
int rank() { return g_rank; }

void write(Level lvl, const std::string& line) {
  if (lvl < g_level) return;
  // Informational output comes from rank 0 only; warnings and errors from every rank.
  if (lvl < Level::Warn && g_rank != 0) return;
  std::string prefix = "hpctrain";
  if (g_world > 1) prefix += "[" + std::to_string(g_rank) + "]";
  if (lvl == Level::Warn) prefix += ": warning";
  if (lvl == Level::Error) prefix += ": error";
  std::lock_guard lock(g_mutex);
  FILE* out = lvl >= Level::Warn ? stderr : stdout;
  std::fprintf(out, "%s: %s\n", prefix.c_str(), line.c_str());
  std::fflush(out);
}

}  // namespace hpc::log
