// Options as table entries, for every command line of the suite (hpctrain's training options,
// its subcommands, hpcrun): each entry names an option and the member of the program's options
// struct S it sets, and makes from that one member its Boost option (with the member's
// initialiser shown as the default: one default per option), its reading after parsing, its value
// as text, and the inverse of that text. The factories below are the kinds of option there are;
// a program's table is a list of them (train/options/option_table.cpp, launch/options.cpp).
#pragma once

#include <boost/program_options.hpp>

#include <cmath>
#include <cstddef>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/choice.hpp"
#include "core/duration.hpp"
#include "core/error.hpp"

namespace hpc::options {
namespace po = boost::program_options;

// A config file (hpctrain's --config) is a few lines: hpctrain's reading stops past this, so that
// --config /dev/zero, or a dataset named by mistake, ends in an error rather than taking all the
// memory; hpcrun reads no larger file (hpctrain's to refuse).
constexpr std::size_t kMaxConfigFileBytes = 1 << 20;

// An option's names: --long_name and, where it has one, -short_name (Boost's short option: -H, -x),
// and how people and messages write it: --long_name, else -short_name, else `spelling` where that
// is another word (mpirun's "-np", which Boost alone would read as -n with the value "p").
struct Name {
  Name(const char* long_) : long_name(long_) {}  // implicit: most options have a long name only
  Name(const char* long_, char short_, std::string spelt = "")
      : long_name(long_), short_name(short_), spelling(spelt.empty() ? std::string{'-', short_} : std::move(spelt)) {}
  std::string long_name;
  char short_name = 0;
  std::string spelling;  // empty: --long_name
  std::string boost() const { return short_name ? long_name + ',' + short_name : long_name; }
  std::string shown() const { return spelling.empty() ? "--" + long_name : spelling; }
};

template <class S>
struct Entry {
  std::string name;  // the long option, without "--"
  // Adds it to a Boost description, bound to s's member where Boost can fill it itself.
  std::function<void(po::options_description& d, S& s)> add;
  // After parsing: the members Boost cannot fill (choices, --no-X switches, durations), from what
  // it stored in vm, and the checks of what was given. May be empty.
  std::function<void(const po::variables_map& vm, S& s)> read;
  // The value as text (hpctrain's checkpoints record it: an option's text must never change).
  std::function<std::string(const S& s)> value;
  // The inverse of value: the member from its text. Text value cannot have written is a usage
  // error naming the option.
  std::function<void(const std::string& text, S& s)> parse;
  // How people write it when not --name (Name::spelling): "-H", "-np".
  std::string spelling = "";
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

// Words, one a line (a list's value), and back.
std::string lines_text(const std::vector<std::string>& words);
std::vector<std::string> lines_from_text(const std::string& t);

// A rule for a value given: a usage error, naming the option as `shown` (Name::shown), when the
// value breaks it. The ranges below are the common ones; a program may write its own.
template <class T>
using Check = std::function<void(const T& value, const std::string& shown)>;

// "--x must be 0 or more, got -1".
template <class T>
Check<T> at_least(T lowest) {
  return [=](const T& v, const std::string& shown) {
    HPC_REQUIRE(v >= lowest, shown, " must be ", text(lowest), " or more, got ", text(v));
  };
}

// "--x must be more than 1 (why), got 1"; NaN and infinity are refused too.
template <class T>
Check<T> more_than(T lowest, std::string why = "") {
  return [=](const T& v, const std::string& shown) {
    bool finite = true;
    if constexpr (std::is_floating_point_v<T>) finite = std::isfinite(v);
    HPC_REQUIRE(v > lowest && finite, shown, " must be more than ", text(lowest), why.empty() ? "" : " (" + why + ")",
                ", got ", text(v));
  };
}

// "--x must be a whole number from 1 to 4096, got 5000".
template <class T>
Check<T> from_to(T lowest, T highest) {
  static_assert(std::is_integral_v<T>, "a range of whole numbers");
  return [=](const T& v, const std::string& shown) {
    HPC_REQUIRE(v >= lowest && v <= highest, shown, " must be a whole number from ", lowest, " to ", highest,
                ", got ", v);
  };
}

// Whether the member's initial value is the option's default, shown in --help (Shown), or only what
// the member holds when the option is not given, which the option's help explains (None: hpcrun's
// -np, 0 for "every slot"; checked only when given).
enum class Default { Shown, None };

// The member an accessor reaches in an S ([](auto& s) -> auto& { return s.inner.x; }).
template <class S, class At>
using member_t = std::remove_cvref_t<std::invoke_result_t<At, S&>>;

// The accessor of a member of S.
template <class S, class T>
auto member(T S::*m) {
  return [m](auto& s) -> auto& { return s.*m; };
}

namespace detail {

template <class S>
Entry<S> make(const Name& n, std::function<void(po::options_description&, S&)> add,
              std::function<void(const po::variables_map&, S&)> read, std::function<std::string(const S&)> value,
              std::function<void(const std::string&, S&)> parse) {
  return {n.long_name, std::move(add), std::move(read), std::move(value), std::move(parse), n.spelling};
}

// The read of a member Boost fills itself: `check` on the value the map holds, when given (or
// defaulted). The map's, not the member's: a config file is checked on its own in a map of its
// own (train/options/options.cpp), whose values never reach the member.
template <class S, class T>
std::function<void(const po::variables_map&, S&)> checked(const Name& n, Check<T> check) {
  if (!check) return {};
  return [=](const po::variables_map& vm, S&) {
    if (vm.count(n.long_name)) check(vm[n.long_name].template as<T>(), n.shown());
  };
}

}  // namespace detail

// A number, shown with its default (Default::Shown), checked by `check` (a range) when given.
template <class S, class At>
Entry<S> number_at(Name name, At at, std::string help, Check<member_t<S, At>> check = {},
                   Default shown = Default::Shown) {
  using T = member_t<S, At>;
  return detail::make<S>(
      name,
      [=](po::options_description& d, S& s) {
        auto* v = po::value(&at(s));
        if (shown == Default::Shown) v->default_value(at(s), text(at(s)));
        d.add_options()(name.boost().c_str(), v, help.c_str());
      },
      detail::checked<S>(name, std::move(check)), [at](const S& s) { return text(at(s)); },
      [=](const std::string& t, S& s) { at(s) = number_from_text<T>(t, name.long_name); });
}

// The same for a member of S.
template <class S, class T>
Entry<S> number(Name name, T S::*m, std::string help, std::type_identity_t<Check<T>> check = {},
                Default shown = Default::Shown) {
  return number_at<S>(std::move(name), member(m), std::move(help), std::move(check), shown);
}

// "--x is empty (an unset variable?): ...", for a blank value.
void refuse_blank(const std::string& value, const std::string& shown);

// Text: a path, a file name, a host list. Optional, Required (Boost then refuses a command line
// without it; given blank, it is refused as NotBlank's), or NotBlank: optional, but given empty or
// blank it is "--x is empty", as an unset variable in a script writes it, never a wish for the
// default.
enum class Presence { Optional, Required, NotBlank };

namespace detail {

template <class S>
Entry<S> text_entry(Name name, std::string S::*m, std::string help, Presence presence, Default shown) {
  return make<S>(
      name,
      [=](po::options_description& d, S& s) {
        auto* v = po::value(&(s.*m));
        if (presence == Presence::Required) v->required();
        if (shown == Default::Shown && !(s.*m).empty()) v->default_value(s.*m);
        d.add_options()(name.boost().c_str(), v, help.c_str());
      },
      checked<S>(name, presence != Presence::Optional ? Check<std::string>(refuse_blank) : nullptr),
      [m](const S& s) { return s.*m; }, [m](const std::string& t, S& s) { s.*m = t; });
}

}  // namespace detail

// A path or file name (or other text); none by default.
template <class S>
Entry<S> path(Name name, std::string S::*m, std::string help, Presence presence = Presence::Optional) {
  return detail::text_entry(std::move(name), m, std::move(help), presence, Default::None);
}

// Text with a default, its member's initial value, shown in --help where it is not empty.
template <class S>
Entry<S> text_with_default(Name name, std::string S::*m, std::string help, Presence presence = Presence::Optional) {
  return detail::text_entry(std::move(name), m, std::move(help), presence, Default::Shown);
}

// Words, as many as given (also as positional arguments where the program maps them); their
// value is the words joined by newlines.
template <class S>
Entry<S> list(Name name, std::vector<std::string> S::*m, std::string help) {
  return detail::make<S>(
      name,
      [=](po::options_description& d, S& s) {
        d.add_options()(name.boost().c_str(), po::value(&(s.*m))->multitoken(), help.c_str());
      },
      {}, [m](const S& s) { return lines_text(s.*m); }, [m](const std::string& t, S& s) { s.*m = lines_from_text(t); });
}

// One word each time it is given (-x A -x B=1), each checked by `each`; its value is the words
// joined by newlines.
template <class S>
Entry<S> repeated(Name name, std::vector<std::string> S::*m, std::string help, Check<std::string> each = {}) {
  return detail::make<S>(
      name,
      [=](po::options_description& d, S& s) {
        d.add_options()(name.boost().c_str(), po::value(&(s.*m))->composing(), help.c_str());
      },
      [=](const po::variables_map&, S& s) {
        if (each)
          for (const std::string& w : s.*m) each(w, name.shown());
      },
      [m](const S& s) { return lines_text(s.*m); }, [m](const std::string& t, S& s) { s.*m = lines_from_text(t); });
}

// --name sets the member.
template <class S, class At>
Entry<S> flag_at(Name name, At at, std::string help) {
  return detail::make<S>(
      name,
      [=](po::options_description& d, S& s) {
        d.add_options()(name.boost().c_str(), po::bool_switch(&at(s)), help.c_str());
      },
      {}, [at](const S& s) { return text(at(s)); },
      [=](const std::string& t, S& s) { at(s) = bool_from_text(t, name.long_name); });
}

// The same for a member of S.
template <class S>
Entry<S> flag(Name name, bool S::*m, std::string help) {
  return flag_at<S>(std::move(name), member(m), std::move(help));
}

// --name clears the member (--no-nesterov: nesterov = false); its value is the switch's.
template <class S>
Entry<S> negation(Name name, bool S::*m, std::string help) {
  const std::string n = name.long_name;
  return detail::make<S>(
      name,
      [=](po::options_description& d, S&) { d.add_options()(name.boost().c_str(), po::bool_switch(), help.c_str()); },
      [=](const po::variables_map& vm, S& s) { s.*m = !vm[n].template as<bool>(); },
      [m](const S& s) { return text(!(s.*m)); }, [=](const std::string& t, S& s) { s.*m = !bool_from_text(t, n); });
}

// One of `names`, shown with the default's name; an unknown word is "unknown WHAT 'x' (choose
// ...)", WHAT being --name unless given.
template <class S, class E, size_t N>
Entry<S> choice(Name name, E S::*m, const Named<E> (&names)[N], std::string help, std::string what = "") {
  if (what.empty()) what = name.shown();
  const std::string n = name.long_name;
  return detail::make<S>(
      name,
      [=, &names](po::options_description& d, S& s) {
        d.add_options()(name.boost().c_str(), po::value<std::string>()->default_value(name_of(names, s.*m)),
                        help.c_str());
      },
      [=, &names](const po::variables_map& vm, S& s) {  // blank: an unset variable, not a wrong word
        const std::string& given = vm[n].template as<std::string>();
        refuse_blank(given, name.shown());
        s.*m = parse_named(names, given, what);
      },
      [m, &names](const S& s) { return std::string(name_of(names, s.*m)); },
      [=, &names](const std::string& t, S& s) { s.*m = parse_named(names, t, what); });
}

// A duration in seconds, given as 90s, 10m, 1.5h (parse_duration) and checked by `check`; its
// default is the seconds' initial value, shown as duration_text writes it (Default::Shown), or none
// (Default::None: the seconds keep their initial value unless given). Its value is the seconds.
// `at` reaches them in an S, const or not ([](auto& s) -> auto& { return s.inner.seconds; } for a
// nested member).
template <class S, class At>
Entry<S> duration_at(Name name, At at, std::string help, Check<double> check = {}, Default shown = Default::Shown) {
  const std::string n = name.long_name;
  return detail::make<S>(
      name,
      [=](po::options_description& d, S& s) {
        auto* v = po::value<std::string>();
        if (shown == Default::Shown) v->default_value(duration_text(at(s)));
        d.add_options()(name.boost().c_str(), v, help.c_str());
      },
      [=](const po::variables_map& vm, S& s) {
        if (!vm.count(n)) return;
        at(s) = parse_duration(vm[n].template as<std::string>(), n.c_str());
        if (check) check(at(s), name.shown());
      },
      [at](const S& s) { return text(at(s)); },
      [=](const std::string& t, S& s) { at(s) = number_from_text<double>(t, n); });
}

// The same for a member of S.
template <class S>
Entry<S> duration(Name name, double S::*m, std::string help, Check<double> check = {},
                  Default shown = Default::Shown) {
  return duration_at<S>(std::move(name), member(m), std::move(help), std::move(check), shown);
}

// The entry, also noting in `given` whether the command line gave it (not its default): hpcrun's
// --launch-agent, given, may reach hosts this machine cannot resolve.
template <class S>
Entry<S> noting_given(Entry<S> e, bool std::type_identity_t<S>::*given) {
  e.read = [read = e.read, name = e.name, given](const po::variables_map& vm, S& s) {
    s.*given = vm.count(name) && !vm[name].defaulted();
    if (read) read(vm, s);
  };
  return e;
}

// The entry, then `step` on what it read: a text made into the members it stands for (a MIN:MAX
// pair, mpirun's words), a default taken from another option read before it.
template <class S>
Entry<S> then(Entry<S> e, std::type_identity_t<std::function<void(S&)>> step) {
  e.read = [read = e.read, step](const po::variables_map& vm, S& s) {
    if (read) read(vm, s);
    step(s);
  };
  return e;
}

// The option an argument names with its entry's single-dash spelling ("-np", "-np=4"), as Boost
// reads it: "--np", "--np=4". Any other argument as it is.
template <class S>
std::string long_form(const Entry<S>& e, const std::string& arg) {
  if (e.spelling.size() < 3 || e.spelling[1] == '-' || arg.rfind(e.spelling, 0) != 0) return arg;
  const std::string rest = arg.substr(e.spelling.size());
  return rest.empty() || rest[0] == '=' ? "--" + e.name + rest : arg;
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

// Boost's message for e (e.what()), without Boost's hang: Boost fills its message's placeholders
// (%canonical_option%, %value%, ...) in a loop that ends only when none is left, so a word that
// holds its own placeholder (`--x%canonical_option%`, `epochs = %value%` in a config file) made
// what() loop forever. Every message of a po::error in the suite goes through this.
std::string what_of(const po::error& e);

// Boost's message for e, with the word named where Boost does not name it: a word on the
// command line that is no option, nor an option's value, beyond the positional arguments
// `positional` takes ("too many positional options have been specified" says neither which
// word nor why).
std::string error_text(const po::error& e, int argc, const char* const* argv, const po::options_description& options,
                       const po::positional_options_description& positional);
// How hpctrain and hpcrun read a command line: Boost's default, but an option is named whole.
// Boost would take any unambiguous prefix (--res for --resume), which the wrappers that read
// hpctrain's arguments (hpcrun, slurm/job.sh, users' scripts) do not see: hpcrun would add
// --resume auto beside --res none, and a run told to start afresh would continue an old one. A
// prefix is refused with the name it stands for (unknown_option_text).
constexpr int kCommandLineStyle = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
// For an option `options` does not know: Boost's words, and the names it begins (" (options are
// named whole: --resume?)", or "; it begins --a, --b") or the one it misspells (" (did you mean
// --resume?)"), where there are.
std::string unknown_option_text(const po::unknown_option& e, const po::options_description& options);
// Boost's message for a value it could not read, with the kind of number the option takes
// where it is a number ("--threads must be a whole number, got '99999999999' (out of range)",
// where Boost says "the argument ... is invalid"); what_of(e) otherwise.
std::string value_error_text(const po::error& e, const po::options_description& options);
// " (out of range)" where `given` is a number's text that a number type cannot hold (1e999, or
// a whole number such as 99999999999 past an int), else "" (then it is no number of its kind).
std::string out_of_range(const std::string& given);

// Parses a subcommand's argv (argv[0]: its name; hpctrain's evaluate, inspect, export, predict,
// clean-snapshots) into vm. Returns false when --help was asked for (printed when `speak`);
// anything wrong is a usage error.
bool parse_subcommand(int argc, const char* const* argv, const po::options_description& options,
                      const po::positional_options_description& positional, po::variables_map& vm, bool speak);

}  // namespace hpc::options
