// Options as table entries, for every command line of the suite (hpctrain's training options,
// its subcommands, hpcrun): each entry names an option and the member of the program's options
// struct S it sets, and makes from that one member its Boost option (with the member's
// initialiser shown as the default: one default per option), its reading after parsing, its value
// as text, and the inverse of that text. The factories below are the kinds of option there are;
// a program's table is a list of them (train/options/option_table.cpp, launch/options.cpp).
#pragma once

#include <boost/program_options.hpp>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/choice.hpp"
#include "core/duration.hpp"
#include "core/error.hpp"

namespace hpc::options {
namespace po = boost::program_options;

template <class S>
struct Entry {
  std::string name;  // the long option, without "--"
  // Adds it to a Boost description, bound to s's member where Boost can fill it itself.
  std::function<void(po::options_description& d, S& s)> add;
  // After parsing: the members Boost cannot fill (choices, --no-X switches, durations), from what
  // it stored in vm. May be empty.
  std::function<void(const po::variables_map& vm, S& s)> read;
  // The value as text (hpctrain's checkpoints record it: an option's text must never change).
  std::function<std::string(const S& s)> value;
  // The inverse of value: the member from its text. Text value cannot have written is a usage
  // error naming the option.
  std::function<void(const std::string& text, S& s)> parse;
};

// As people write them (0.1, not Boost's 0.10000000000000001; six significant digits; booleans
// 0 and 1).
template <class V>
std::string text(const V& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A value's text read back (Entry::parse).
template <class T>
T number_from_text(const std::string& t, const std::string& name) {
  std::istringstream is(t);
  T v{};
  is >> v;
  HPC_REQUIRE(!t.empty() && is && is.peek() == std::char_traits<char>::eof(), "--", name, " '", t,
              "' is not a number");
  return v;
}
bool bool_from_text(const std::string& t, const std::string& name);

// A duration as an option takes it and --help shows it: the shortest of "0", "90s", "10m",
// "2h" that parse_duration reads back as the same seconds.
std::string duration_text(double seconds);

// A number, shown with its default.
template <class S, class T>
Entry<S> number(const char* name, T S::*m, std::string help) {
  return {name,
          [=](po::options_description& d, S& s) {
            d.add_options()(name, po::value(&(s.*m))->default_value(s.*m, text(s.*m)), help.c_str());
          },
          {}, [m](const S& s) { return text(s.*m); },
          [=](const std::string& t, S& s) { s.*m = number_from_text<T>(t, name); }};
}

// A path or file name (or other text); none by default, or required (Boost then refuses a
// command line without it).
enum class Presence { Optional, Required };
template <class S>
Entry<S> path(const char* name, std::string S::*m, std::string help, Presence presence = Presence::Optional) {
  return {name,
          [=](po::options_description& d, S& s) {
            auto* v = po::value(&(s.*m));
            if (presence == Presence::Required) v->required();
            d.add_options()(name, v, help.c_str());
          },
          {}, [m](const S& s) { return s.*m; }, [m](const std::string& t, S& s) { s.*m = t; }};
}

// Words, as many as given (also as positional arguments where the program maps them); their
// value is the words joined by newlines.
template <class S>
Entry<S> list(const char* name, std::vector<std::string> S::*m, std::string help) {
  return {name,
          [=](po::options_description& d, S& s) {
            d.add_options()(name, po::value(&(s.*m))->multitoken(), help.c_str());
          },
          {},
          [m](const S& s) {
            std::string out;
            for (const std::string& w : s.*m) out += (out.empty() ? "" : "\n") + w;
            return out;
          },
          [m](const std::string& t, S& s) {
            s.*m = {};
            std::istringstream in(t);
            for (std::string w; std::getline(in, w);) (s.*m).push_back(w);
          }};
}

// --name sets the member.
template <class S>
Entry<S> flag(const char* name, bool S::*m, std::string help) {
  return {name,
          [=](po::options_description& d, S& s) { d.add_options()(name, po::bool_switch(&(s.*m)), help.c_str()); },
          {}, [m](const S& s) { return text(s.*m); },
          [=](const std::string& t, S& s) { s.*m = bool_from_text(t, name); }};
}

// --name clears the member (--no-nesterov: nesterov = false); its value is the switch's.
template <class S>
Entry<S> negation(const char* name, bool S::*m, std::string help) {
  return {name,
          [=](po::options_description& d, S&) { d.add_options()(name, po::bool_switch(), help.c_str()); },
          [=](const po::variables_map& vm, S& s) { s.*m = !vm[name].template as<bool>(); },
          [m](const S& s) { return text(!(s.*m)); },
          [=](const std::string& t, S& s) { s.*m = !bool_from_text(t, name); }};
}

// One of `names`, shown with the default's name; an unknown word is "unknown WHAT 'x' (choose
// ...)", WHAT being --name unless given.
template <class S, class E, size_t N>
Entry<S> choice(const char* name, E S::*m, const Named<E> (&names)[N], std::string help, std::string what = "") {
  if (what.empty()) what = std::string("--") + name;
  return {name,
          [=, &names](po::options_description& d, S& s) {
            d.add_options()(name, po::value<std::string>()->default_value(name_of(names, s.*m)), help.c_str());
          },
          [=, &names](const po::variables_map& vm, S& s) {
            s.*m = parse_named(names, vm[name].template as<std::string>(), what);
          },
          [m, &names](const S& s) { return std::string(name_of(names, s.*m)); },
          [=, &names](const std::string& t, S& s) { s.*m = parse_named(names, t, what); }};
}

// A duration in seconds, given as 90s, 10m, 1.5h (parse_duration); its default is the seconds'
// initial value, shown as duration_text writes it. Its value is the seconds. `at` reaches them in
// an S, const or not ([](auto& s) -> auto& { return s.inner.seconds; } for a nested member).
template <class S, class At>
Entry<S> duration_at(const char* name, At at, std::string help) {
  return {name,
          [=](po::options_description& d, S& s) {
            d.add_options()(name, po::value<std::string>()->default_value(duration_text(at(s))), help.c_str());
          },
          [=](const po::variables_map& vm, S& s) { at(s) = parse_duration(vm[name].template as<std::string>(), name); },
          [at](const S& s) { return text(at(s)); },
          [=](const std::string& t, S& s) { at(s) = number_from_text<double>(t, name); }};
}

// The same for a member of S.
template <class S>
Entry<S> duration(const char* name, double S::*m, std::string help) {
  return duration_at<S>(name, [m](auto& s) -> auto& { return s.*m; }, std::move(help));
}

// Each entry's Boost option, bound to s.
template <class S>
void add(const std::vector<Entry<S>>& table, po::options_description& d, S& s) {
  for (const Entry<S>& e : table) e.add(d, s);
}

// After Boost has parsed into vm: each entry's own reading.
template <class S>
void read(const std::vector<Entry<S>>& table, const po::variables_map& vm, S& s) {
  for (const Entry<S>& e : table)
    if (e.read) e.read(vm, s);
}

// Parses a subcommand's argv (argv[0]: its name; hpctrain's evaluate, inspect, export, predict,
// clean-snapshots) into vm. Returns false when --help was asked for (printed when `speak`);
// anything wrong is a usage error.
bool parse_subcommand(int argc, const char* const* argv, const po::options_description& options,
                      const po::positional_options_description& positional, po::variables_map& vm, bool speak);

}  // namespace hpc::options
