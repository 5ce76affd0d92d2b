#include "core/option_kit.hpp"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <iostream>

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

std::string error_text(const po::error& e, int argc, const char* const* argv, const po::options_description& options,
                       const po::positional_options_description& positional) {
  if (!dynamic_cast<const po::too_many_positional_options_error*>(&e)) return e.what();
  unsigned words = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;  // the rest are positional: Boost named none of them as an option
    if (word.size() > 2 && word.rfind("--", 0) == 0) {
      if (word.find('=') != std::string::npos) continue;
      const po::option_description* o = options.find_nothrow(word.substr(2), true);
      if (o && o->semantic()->max_tokens() > 0) ++i;  // its value
      continue;
    }
    if (word.size() > 1 && word[0] == '-' && !std::isdigit(static_cast<unsigned char>(word[1]))) continue;
    if (++words > positional.max_total_count()) {
      const unsigned taken = positional.max_total_count();
      return "'" + word + "' is no option, nor the value of one" +
             (taken == 0 ? std::string() : " (" + std::to_string(taken) + " argument(s) at most besides the options)");
    }
  }
  return e.what();
}

bool parse_subcommand(int argc, const char* const* argv, const po::options_description& options,
                      const po::positional_options_description& positional, po::variables_map& vm, bool speak) {
  try {
    po::store(po::command_line_parser(argc, argv).options(options).positional(positional).run(), vm);
    if (vm.count("help")) {  // before notify, which would insist on the required options
      if (speak) std::cout << options << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    usage_error(error_text(e, argc, argv, options, positional));
  }
  return true;
}

}  // namespace hpc::options
