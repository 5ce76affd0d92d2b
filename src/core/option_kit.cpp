#include "core/option_kit.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>

#include "core/log.hpp"
#include "core/spelling.hpp"

namespace hpc::options {

bool bool_from_text(const std::string& t, const std::string& name) {
  HPC_REQUIRE(t == "0" || t == "1", "--", name, " '", t, "' is not 0 or 1");
  return t == "1";
}

void refuse_blank(const std::string& value, const std::string& shown) {
  HPC_REQUIRE(value.find_first_not_of(" \t\n\v\f\r") != std::string::npos, shown,
              " is empty (an unset variable?): give a value or leave the option out");
}

std::string lines_text(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : "\n") + w;
  return out;
}

std::vector<std::string> lines_from_text(const std::string& t) {
  std::vector<std::string> out;
  std::istringstream in(t);
  for (std::string w; std::getline(in, w);) out.push_back(w);
  return out;
}

namespace {

std::string exact(double v) {  // 15 digits: what a person wrote (0.1, not 0.10000000000000001), read back the same
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

}  // namespace

std::string duration_text(double seconds) {
  if (seconds == 0) return "0";
  for (const auto& [unit, size] : {std::pair<const char*, double>{"h", 3600}, {"m", 60}}) {
    const double n = seconds / size;
    if (n >= 1 && n == std::floor(n)) return exact(n) + unit;
  }
  return exact(seconds) + "s";
}

namespace {

template <class T>
bool takes(const po::value_semantic* s) {
  return dynamic_cast<const po::typed_value<T>*>(s) != nullptr;
}

// What an option of a number type takes, for Boost's "the argument ('99999999999') for option
// '--threads' is invalid", which says neither: "" for an option of another kind. (The option's
// own range, checked once the value is read, is narrower: the type's bounds are not named.)
std::string number_kind(const po::value_semantic* s) {
  if (takes<int>(s) || takes<long>(s) || takes<long long>(s) || takes<unsigned>(s) || takes<unsigned long>(s) ||
      takes<unsigned long long>(s))
    return "a whole number";
  if (takes<double>(s) || takes<float>(s)) return "a number";
  return "";
}

}  // namespace

std::string out_of_range(const std::string& given) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(given.c_str(), &end);
  if (end == given.c_str() || *end != '\0') return "";
  const bool whole_past_an_int = std::floor(v) == v && std::abs(v) >= 2147483648.0;
  return errno == ERANGE || whole_past_an_int ? " (out of range)" : "";
}

namespace {

// The words an error_with_option_name fills its message with (protected in Boost; a pointer to
// a member reached through a derived class is the language's one way to them).
struct Substitutions : po::error_with_option_name {
  static std::map<std::string, std::string>& of(po::error_with_option_name& e) {
    return e.*(&Substitutions::m_substitutions);
  }
};

constexpr char kPercentStandIn = '\x01';  // no placeholder can be made of it

}  // namespace

std::string what_of(const po::error& e) {
  const auto* named = dynamic_cast<const po::error_with_option_name*>(&e);
  if (!named) return e.what();
  // On a copy: each '%' of the words a stand-in while Boost fills the placeholders, so no word
  // brings a placeholder back; then the '%' again.
  po::error_with_option_name copy(*named);
  for (auto& [key, word] : Substitutions::of(copy)) std::replace(word.begin(), word.end(), '%', kPercentStandIn);
  std::string text = copy.what();
  std::replace(text.begin(), text.end(), kPercentStandIn, '%');
  return text;
}

std::string unknown_option_text(const po::unknown_option& e, const po::options_description& options) {
  std::string given = e.get_option_name();  // "--res", or "--res=none"'s "--res"
  while (!given.empty() && given[0] == '-') given.erase(0, 1);
  given = given.substr(0, given.find('='));
  std::vector<std::string> names, begun;
  for (const auto& o : options.options()) {
    const std::string& name = o->long_name();
    if (name.empty()) continue;
    names.push_back(name);
    if (!given.empty() && name.rfind(given, 0) == 0) begun.push_back("--" + name);
  }
  const std::string what = what_of(e);
  if (begun.size() == 1) return what + " (options are named whole: " + begun.front() + "?)";
  if (begun.size() > 1) {
    std::string list;
    for (const std::string& b : begun) list += (list.empty() ? "" : ", ") + b;
    return what + " (options are named whole; it begins " + list + ")";
  }
  const std::string near = nearest_name(names, given);
  return near.empty() ? what : what + " (did you mean --" + near + "?)";
}

std::string value_error_text(const po::error& e, const po::options_description& options) {
  if (const auto* unknown = dynamic_cast<const po::unknown_option*>(&e)) return unknown_option_text(*unknown, options);
  const auto* invalid = dynamic_cast<const po::invalid_option_value*>(&e);
  if (!invalid) return what_of(e);
  std::string name = invalid->get_option_name();  // "--threads"
  while (!name.empty() && name[0] == '-') name.erase(0, 1);
  const po::option_description* o = options.find_nothrow(name, false);
  const std::string kind = o ? number_kind(o->semantic().get()) : "";
  if (kind.empty()) return what_of(e);
  // Boost's own words hold the value given: "the argument ('V') for option ...".
  const std::string what = what_of(e);
  const size_t from = what.find("('"), to = what.find("')");
  const std::string given = from != std::string::npos && to != std::string::npos && to > from
                                ? what.substr(from + 2, to - from - 2)
                                : "";
  return "--" + name + " must be " + kind + ", got '" + given + "'" + out_of_range(given);
}

std::string error_text(const po::error& e, int argc, const char* const* argv, const po::options_description& options,
                       const po::positional_options_description& positional) {
  if (!dynamic_cast<const po::too_many_positional_options_error*>(&e)) return value_error_text(e, options);
  unsigned words = 0;
  // An option whose value was left out takes the next word, an option too (`--resume
  // --checkpoint-dir ck`: --resume's value is "--checkpoint-dir", and ck is left over): said, as
  // the stray word alone would not tell what went wrong.
  std::string swallowed;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;  // the rest are positional: Boost named none of them as an option
    if (word.size() > 2 && word.rfind("--", 0) == 0) {
      swallowed.clear();
      if (word.find('=') != std::string::npos) continue;
      const po::option_description* o = options.find_nothrow(word.substr(2), true);
      if (o && o->semantic()->max_tokens() > 0 && i + 1 < argc) {
        const std::string value = argv[++i];  // its value
        if (value.size() > 2 && value.rfind("--", 0) == 0 && value != "--")
          swallowed = "--" + o->long_name() + " took '" + value + "' as its value: give --" + o->long_name() + " one";
      }
      continue;
    }
    if (word.size() > 1 && word[0] == '-' && !std::isdigit(static_cast<unsigned char>(word[1]))) {
      swallowed.clear();
      continue;
    }
    if (++words > positional.max_total_count()) {
      const unsigned taken = positional.max_total_count();
      std::string notes = swallowed;
      if (taken > 0) notes += (notes.empty() ? "" : "; ") + std::to_string(taken) + " argument(s) at most besides the options";
      return "'" + word + "' is no option, nor the value of one" + (notes.empty() ? std::string() : " (" + notes + ")");
    }
    swallowed.clear();
  }
  return what_of(e);
}

bool parse_subcommand(int argc, const char* const* argv, const po::options_description& options,
                      const po::positional_options_description& positional, po::variables_map& vm, bool speak) {
  try {
    po::store(po::command_line_parser(argc, argv).options(options).positional(positional).style(kCommandLineStyle).run(),
              vm);
    if (vm.count("help")) {  // before notify, which would insist on the required options
      if (speak) log::write_help(hpc::detail::concat(options, "\n"));
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    usage_error(error_text(e, argc, argv, options, positional));
  }
  return true;
}

}  // namespace hpc::options
