// Choices by name: an option's words (--model cnn, --precision bf16) are parsed once, at the
// edge, into an enum, and named again where they are shown or recorded (--help, checkpoints,
// log lines). Each layer lists its own: an array of Named entries beside the enum.
#pragma once

#include <iterator>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace hpc {

template <class E>
struct Named {
  const char* name;
  E value;
};

// "a, b or c": the names, for help and errors.
template <class Choices>
std::string names_of(const Choices& choices) {
  std::string s;
  const auto n = static_cast<size_t>(std::size(choices));
  size_t i = 0;
  for (const auto& c : choices) {
    s += (i == 0 ? "" : i + 1 == n ? " or " : ", ") + std::string(c.name);
    ++i;
  }
  return s;
}

template <class Choices, class E>
const char* name_of(const Choices& choices, E value) {
  for (const auto& c : choices)
    if (c.value == value) return c.name;
  HPC_CHECK(false, "a value without a name among ", names_of(choices));
  return "";
}

// Whether `text` names one of the choices; *out is then its value.
template <class Choices, class E>
bool find_named(const Choices& choices, std::string_view text, E* out) {
  for (const auto& c : choices)
    if (text == c.name) {
      *out = c.value;
      return true;
    }
  return false;
}

// The value `text` names; a usage error "unknown WHAT 'text' (choose a, b or c)" otherwise.
template <class Choices>
auto parse_named(const Choices& choices, const std::string& text, const std::string& what) {
  decltype(std::begin(choices)->value) v{};
  HPC_REQUIRE(find_named(choices, text, &v), "unknown ", what, " '", text, "' (choose ", names_of(choices), ")");
  return v;
}

}  // namespace hpc
