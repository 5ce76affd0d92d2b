// The option table (train/options/option_table.cpp): every option is listed here with its rule for ranks
// and resume and another value than its default. The table must hold exactly these; --help must
// show each; the cross-rank agreement check (option_values, which every rank compares and every
// checkpoint records) must compare each option whose rule is not Local and no other; and the
// resume check must refuse another value of each Match option and accept it of the others; and
// what a checkpoint records of each must read back as the same value. An
// option added to the table and not here fails the first check (and one without a rule does not
// compile).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "nn/model.hpp"
#include "optim/sgd.hpp"
#include "train/options/options.hpp"
#include "train/run/setup.hpp"
#include "train/state/checkpointing.hpp"
#include "temp_dir.hpp"

namespace hpc::testing {
namespace {

using train::Rule;

struct Listed {
  const char* name;
  Rule rule;
  std::vector<std::string> other;  // a command line that gives it another value than its default
};

const std::vector<Listed>& every_option() {
  static const std::vector<Listed> list{
      {"quiet", Rule::Local, {"--quiet"}},
      {"metrics-file", Rule::Local, {"--metrics-file", "m.jsonl"}},
      {"metrics-every-steps", Rule::Local, {"--metrics-file", "m.jsonl", "--metrics-every-steps", "10"}},
      {"prometheus-file", Rule::Local, {"--prometheus-file", "/tmp/hpctrain.prom"}},
      {"progress", Rule::Local, {"--progress", "lines"}},
      {"log-every", Rule::Local, {"--log-every", "7"}},
      {"progress-interval", Rule::Local, {"--progress-interval", "5s"}},
      {"log-level", Rule::Local, {"--log-level", "debug"}},
      {"log-timestamps", Rule::Local, {"--log-timestamps", "on"}},
      {"seed", Rule::Match, {"--seed", "2"}},
      {"threads", Rule::Local, {"--threads", "3"}},
      {"device", Rule::Agree, {"--device", "cpu"}},
      {"precision", Rule::Agree, {"--precision", "fp32"}},
      {"cuda-graphs", Rule::Agree, {"--cuda-graphs"}},
      {"jpeg-decode", Rule::Agree, {"--jpeg-decode", "gpu"}},
      {"no-deterministic", Rule::Agree, {"--no-deterministic"}},
      {"model", Rule::Match, {"--model", "resnet20"}},
      {"no-batch-norm", Rule::Match, {"--no-batch-norm"}},
      {"init", Rule::Agree, {"--init", "kaiming-normal"}},
      {"dataset", Rule::Match, {"--dataset", "mnist"}},
      {"data-dir", Rule::Local, {"--data-dir", "/tmp"}},
      {"image-size", Rule::Match, {"--image-size", "32"}},
      {"train-samples", Rule::Match, {"--train-samples", "100"}},
      {"test-samples", Rule::Agree, {"--test-samples", "100"}},
      {"augment", Rule::Match, {"--augment", "on"}},
      {"epochs", Rule::Match, {"--epochs", "5"}},
      {"max-steps", Rule::Match, {"--max-steps", "10"}},
      {"batch-size", Rule::Match, {"--batch-size", "32"}},
      {"global-batch-size", Rule::Agree, {"--global-batch-size", "128"}},  // the checkpoint's (below)
      {"keep-last-batch", Rule::Match, {"--keep-last-batch"}},
      {"eval-batch-size", Rule::Agree, {"--eval-batch-size", "500"}},
      {"lr", Rule::Match, {"--lr", "0.05"}},
      {"lr-schedule", Rule::Match, {"--lr-schedule", "cosine"}},
      {"warmup-epochs", Rule::Match, {"--warmup-epochs", "1"}},
      {"lr-step-epochs", Rule::Match, {"--lr-step-epochs", "1,2"}},
      {"lr-gamma", Rule::Match, {"--lr-gamma", "0.5"}},
      {"min-lr", Rule::Match, {"--min-lr", "0.01"}},
      {"onecycle-pct-start", Rule::Match, {"--onecycle-pct-start", "0.4"}},
      {"onecycle-div-factor", Rule::Match, {"--onecycle-div-factor", "10"}},
      {"onecycle-final-div-factor", Rule::Match, {"--onecycle-final-div-factor", "100"}},
      {"onecycle-base-momentum", Rule::Match, {"--onecycle-base-momentum", "0.8"}},
      {"onecycle-max-momentum", Rule::Match, {"--onecycle-max-momentum", "0.9"}},
      {"no-cycle-momentum", Rule::Match, {"--no-cycle-momentum"}},
      {"momentum", Rule::Match, {"--momentum", "0.8"}},
      {"no-nesterov", Rule::Match, {"--no-nesterov"}},
      {"weight-decay", Rule::Match, {"--weight-decay", "0.001"}},
      {"decay-bias-and-norm", Rule::Match, {"--no-decay-bias-and-norm"}},
      {"label-smoothing", Rule::Match, {"--label-smoothing", "0.2"}},
      {"bucket-mb", Rule::Agree, {"--bucket-mb", "1"}},
      {"no-overlap", Rule::Agree, {"--no-overlap"}},
      {"sync-batch-norm", Rule::Match, {"--sync-batch-norm"}},
      {"timeline-file", Rule::Local, {"--timeline-file", "t.jsonl"}},
      {"checkpoint-dir", Rule::Local, {"--checkpoint-dir", "ck"}},
      {"keep-checkpoints", Rule::Local, {"--checkpoint-dir", "ck", "--keep-checkpoints", "2"}},
      {"checkpoint-every-steps", Rule::Local, {"--checkpoint-dir", "ck", "--checkpoint-every-steps", "5"}},
      {"checkpoint-interval", Rule::Local, {"--checkpoint-dir", "ck", "--checkpoint-interval", "5m"}},
      {"checkpoint-each-epoch", Rule::Local, {"--checkpoint-dir", "ck", "--checkpoint-each-epoch"}},
      {"checkpoint-lock-wait", Rule::Local, {"--checkpoint-dir", "ck", "--checkpoint-lock-wait", "30s"}},
      {"resume", Rule::Local, {"--resume", "none"}},
      {"init-from", Rule::Agree, {"--init-from", "base.hpck"}},
      {"extend-epochs", Rule::Agree, {"--extend-epochs"}},
      {"step-timeout", Rule::Local, {"--step-timeout", "5m"}},
      {"start-timeout", Rule::Local, {"--start-timeout", "5m"}},
      {"stop-signals", Rule::Local, {"--stop-signals", "usr2,SIGHUP"}},
      {"snapshot-every-steps", Rule::Local, {"--checkpoint-dir", "ck", "--snapshot-every-steps", "5"}},
      {"snapshot-dir", Rule::Local, {"--checkpoint-dir", "ck", "--snapshot-dir", "/tmp/s"}},
      {"snapshot-max-memory", Rule::Local, {"--snapshot-max-memory", "1G"}},
  };
  return list;
}

const char* rule_name(Rule r) { return r == Rule::Local ? "Local" : r == Rule::Agree ? "Agree" : "Match"; }

train::TrainOptions parse(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"hpctrain"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  const std::optional<train::TrainOptions> o = train::parse_options(static_cast<int>(argv.size()), argv.data());
  if (!o) throw std::runtime_error("no options parsed");
  return *o;
}

// An MLP and a checkpoint of it made with the options `args` at step 10 (global batch 128): what
// the resume checks compare a run's options with.
struct MlpCheckpoint {
  static nn::ModelSpec mlp() {
    nn::ModelSpec spec;
    spec.kind = nn::ModelKind::Mlp;
    return spec;
  }
  explicit MlpCheckpoint(const std::vector<std::string>& args) {
    optim::Sgd<float> sgd(model.params(), optim::SgdSpec{});
    c = train::make_checkpoint(parse(args), model, sgd, 1, train::RunPosition{10, 1, 2, 128, 1280});
  }
  nn::Model<float> model{mlp()};
  ckpt::Checkpoint c;
};

std::map<std::string, std::string> agreed_values(const train::TrainOptions& o) {
  std::map<std::string, std::string> m;
  for (const auto& [name, value] : train::option_values(o)) m[name] = value;
  return m;
}

TEST(OptionTable, HoldsEveryListedOptionWithItsRule) {
  std::vector<std::string> listed, table;
  for (const Listed& l : every_option()) listed.push_back(std::string(l.name) + " " + rule_name(l.rule));
  for (const train::OptionRule& r : train::option_rules()) table.push_back(r.name + " " + rule_name(r.rule));
  EXPECT_EQ(table, listed) << "an option added to the table belongs in this test's list, with its rule";
}

TEST(OptionTable, HelpShowsEveryOption) {
  const std::string help = train::help_text();
  for (const Listed& l : every_option()) {
    const std::regex line("(^|\n)  --" + std::string(l.name) + "( |\n)");
    EXPECT_TRUE(std::regex_search(help, line)) << "--" << l.name << " is not in --help:\n" << help;
  }
}

// Another value of an option that is not Local is another value for the ranks to compare;
// a Local one is not compared (ranks may differ in it).
TEST(OptionTable, TheAgreementCheckComparesEveryOptionButTheLocalOnes) {
  const auto defaults = agreed_values(parse({}));
  for (const Listed& l : every_option()) {
    SCOPED_TRACE(l.name);
    const auto other = agreed_values(parse(l.other));
    if (l.rule == Rule::Local) {
      EXPECT_EQ(defaults.count(l.name), 0u);
      EXPECT_EQ(other, defaults);
      continue;
    }
    ASSERT_EQ(defaults.count(l.name), 1u);
    EXPECT_NE(other.at(l.name), defaults.at(l.name));
    auto rest = other;
    rest[l.name] = defaults.at(l.name);
    EXPECT_EQ(rest, defaults) << "another value of --" << l.name << " changed other options' values too";
  }
}

// A checkpoint made with the defaults resumes with another value of every option but those of
// rule Match, which are refused by name.
TEST(OptionTable, TheResumeCheckRefusesAnotherValueOfEveryMatchOption) {
  const MlpCheckpoint made({});
  const auto& [model, c] = made;
  for (const Listed& l : every_option()) {
    SCOPED_TRACE(l.name);
    const train::TrainOptions other = parse(l.other);
    if (l.rule != Rule::Match) {
      EXPECT_NO_THROW(train::check_resumable(c, other, model, 60000));
      continue;
    }
    try {
      train::check_resumable(c, other, model, 60000);
      ADD_FAILURE() << "another --" << l.name << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_NE(std::string(e.what()).find("the checkpoint was made with --" + std::string(l.name) + "="),
                std::string::npos)
          << e.what();
    }
  }
}

// What a checkpoint records of an option (its value's text) reads back through the table as the
// same value: the defaults, and the other value of every option a checkpoint records.
TEST(OptionTable, RecordedOptionsReadBackAsTheValuesTheyWere) {
  for (const Listed& l : every_option()) {
    if (l.rule == Rule::Local) continue;
    SCOPED_TRACE(l.name);
    for (const std::vector<std::string>& args : {std::vector<std::string>{}, l.other}) {
      const train::TrainOptions given = parse(args);
      std::vector<std::string> names;
      for (const auto& [name, value] : train::option_values(given)) names.push_back(name);
      const MlpCheckpoint made(args);
      EXPECT_EQ(agreed_values(train::recorded_options(made.c.meta, names)), agreed_values(given));
    }
  }
  const MlpCheckpoint shards({"--dataset", "shards", "--image-size", "96", "--no-batch-norm", "--lr-step-epochs", "1.5,3"});
  const train::TrainOptions back =
      train::recorded_options(shards.c.meta, {"dataset", "image-size", "no-batch-norm", "lr-step-epochs"});
  EXPECT_EQ(back.dataset, data::DatasetKind::Shards);
  EXPECT_EQ(back.image_size, 96);
  EXPECT_FALSE(back.batch_norm);
  EXPECT_EQ(back.lr_step_epochs, (std::vector<double>{1.5, 3}));
  EXPECT_EQ(back.epochs, train::TrainOptions{}.epochs);  // not asked for: the default
  EXPECT_TRUE(train::records_option(shards.c.meta, "image-size"));
  EXPECT_FALSE(train::records_option(shards.c.meta, "checkpoint-dir"));  // Local: never recorded
}

// Text no run writes, or an option the checkpoint does not record, is the checkpoint's usage
// error, naming the option.
TEST(OptionTable, RecordedOptionsNoRunWritesAreRefusedByName) {
  const std::map<std::string, std::string> meta{{"option.epochs", "5x"},          {"option.dataset", "imagenet"},
                                                {"option.no-batch-norm", "2"},     {"option.lr-step-epochs", "1,a,"},
                                                {"option.label-smoothing", ""}};
  const std::vector<std::pair<std::string, std::string>> cases{
      {"epochs", "--epochs '5x' is not a number (as the checkpoint records it)"},
      {"dataset", "unknown --dataset 'imagenet' (choose "},
      {"no-batch-norm", "--no-batch-norm '2' is not 0 or 1 (as the checkpoint records it)"},
      {"lr-step-epochs", "--lr-step-epochs takes a comma-separated list of epochs, got '1,a' (as the checkpoint"},
      {"label-smoothing", "--label-smoothing '' is not a number (as the checkpoint records it)"},
      {"seed", "the checkpoint does not record --seed"},
  };
  for (const auto& [name, message] : cases) {
    SCOPED_TRACE(name);
    try {
      train::recorded_options(meta, {name});
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

// --cuda-graphs: auto unless asked for (on) or turned off; checkpoints made while it was a flag
// recorded 1 or 0, which read back as on and auto; anything else is the checkpoint's error.
TEST(OptionTable, CudaGraphsAreAutoUnlessAskedForOrTurnedOff) {
  EXPECT_EQ(parse({}).cuda_graphs, train::CudaGraphs::Auto);
  EXPECT_EQ(parse({"--cuda-graphs"}).cuda_graphs, train::CudaGraphs::On);
  EXPECT_EQ(parse({"--no-cuda-graphs"}).cuda_graphs, train::CudaGraphs::Off);
  EXPECT_EQ(agreed_values(parse({"--no-cuda-graphs"})).at("cuda-graphs"), "off");
  for (const auto& [recorded, want] : std::vector<std::pair<std::string, train::CudaGraphs>>{
           {"1", train::CudaGraphs::On}, {"0", train::CudaGraphs::Auto}, {"off", train::CudaGraphs::Off}}) {
    SCOPED_TRACE(recorded);
    EXPECT_EQ(train::recorded_options({{"option.cuda-graphs", recorded}}, {"cuda-graphs"}).cuda_graphs, want);
  }
  try {
    train::recorded_options({{"option.cuda-graphs", "2"}}, {"cuda-graphs"});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cuda-graphs '2'"), std::string::npos) << e.what();
  }
}

// --batch-size is compared only where it sets the global batch: a checkpoint made with
// --batch-size 32 resumes under the checkpoint's --global-batch-size (the per-rank batch is then
// the default, unused), and a run whose global batch differs is refused for that.
TEST(OptionTable, TheBatchSizeIsComparedWhereItSetsTheGlobalBatch) {
  const MlpCheckpoint made({"--batch-size", "32"});
  const auto& [model, c] = made;
  EXPECT_NO_THROW(train::check_resumable(c, parse({"--global-batch-size", "128"}), model, 60000));
  EXPECT_THROW(train::check_resumable(c, parse({"--batch-size", "64"}), model, 60000), Error);
  try {
    train::check_resumable(c, parse({"--global-batch-size", "256"}), model, 60000);
    ADD_FAILURE() << "another global batch was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("global batch of 128; --global-batch-size 256"), std::string::npos) << e.what();
  }
}

// A checkpoint made under --global-batch-size recorded the default --batch-size, which that run
// never used: a --batch-size here is named against the global batch, with the way to resume.
TEST(OptionTable, ABatchSizeAgainstAGlobalBatchCheckpointNamesTheGlobalBatch) {
  const MlpCheckpoint made({"--global-batch-size", "128"});
  const auto& [model, c] = made;
  EXPECT_NO_THROW(train::check_resumable(c, parse({}), model, 60000));
  EXPECT_NO_THROW(train::check_resumable(c, parse({"--global-batch-size", "128"}), model, 60000));
  try {
    train::check_resumable(c, parse({"--batch-size", "128"}), model, 60000);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("made with --global-batch-size 128 (its --batch-size was not used), this run "
                                         "has --batch-size 128: resume with --global-batch-size 128"),
              std::string::npos)
        << e.what();
  }
}

// --train-samples 0, and N at or above the training set's count, both take the whole set: a
// checkpoint recording one resumes with the other (hpctrain before 2026-12-04 took and recorded
// 100000 on Fashion-MNIST's 60000, which this one refuses as a value: such a chain resumes with 0).
// A count below the set's is another run's, refused as before.
TEST(OptionTable, TrainSamplesOfTheWholeSetResumeWithAnyWayOfSayingIt) {
  const MlpCheckpoint above({"--train-samples", "100000"}), none({}), part({"--train-samples", "100"});
  const auto accepted = [](const MlpCheckpoint& m, const std::vector<std::string>& args, int64_t count) {
    try {
      train::check_resumable(m.c, parse(args), m.model, count);
      return std::string();
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  EXPECT_EQ(accepted(above, {}, 60000), "");
  EXPECT_EQ(accepted(above, {"--train-samples", "60000"}, 60000), "");
  EXPECT_EQ(accepted(none, {"--train-samples", "60000"}, 60000), "");
  EXPECT_EQ(accepted(none, {"--train-samples", "100"}, 100), "");  // a set of 100 samples: all of it
  EXPECT_NE(accepted(above, {"--train-samples", "100"}, 60000).find("made with --train-samples=100000"),
            std::string::npos);
  EXPECT_NE(accepted(above, {}, 200000).find("made with --train-samples=100000, this run has --train-samples=0"),
            std::string::npos);  // a larger set: 100000 of it was a part
  EXPECT_NE(accepted(part, {}, 60000).find("made with --train-samples=100"), std::string::npos);
  EXPECT_NE(accepted(none, {"--train-samples", "59999"}, 60000).find("made with --train-samples=0"), std::string::npos);
}

// --extend-epochs lets a resumed run have more --epochs than its checkpoint (4 by default), never
// fewer; without it another --epochs is refused, and the refusal names the way to lengthen.
TEST(OptionTable, ExtendEpochsOnlyLengthensARun) {
  const MlpCheckpoint made({});
  const auto& model = made.model;  // references, not a structured binding: Clang before 16
  const auto& c = made.c;          // cannot capture one in the lambda below
  EXPECT_NO_THROW(train::check_resumable(c, parse({"--epochs", "6", "--extend-epochs"}), model, 60000));
  EXPECT_NO_THROW(train::check_resumable(c, parse({"--extend-epochs"}), model, 60000));
  auto refused = [&](const std::vector<std::string>& args, const std::string& why) {
    try {
      train::check_resumable(c, parse(args), model, 60000);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused({"--epochs", "6"}, "this run has --epochs=6 (resume with the same value, or lengthen the run with "
                             "--extend-epochs, or start afresh with --resume none)");
  refused({"--epochs", "3", "--extend-epochs"}, "--extend-epochs only lengthens a run: the checkpoint's has --epochs "
                                                "4, this one --epochs 3");
  // Only --epochs: another --lr is still another run.
  refused({"--epochs", "6", "--extend-epochs", "--lr", "0.2"}, "the checkpoint was made with --lr=0.1");
}

// --init-from starts a run and --resume FILE continues one: both at once is refused.
TEST(OptionTable, InitFromAndAResumeFileContradict) {
  try {
    parse({"--init-from", "a.hpck", "--resume", "b.hpck"});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--init-from starts a new run from a checkpoint's weights and --resume "
                                         "b.hpck continues the run of that checkpoint: give one of them"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(parse({"--init-from", "a.hpck", "--resume", "none"}));
}

// The values as checkpoints have always recorded them: a resumed run of this version compares
// them with checkpoints written by earlier ones.
TEST(OptionTable, ValuesKeepTheirText) {
  const auto d = agreed_values(parse({}));
  EXPECT_EQ(d.at("model"), "cnn");
  EXPECT_EQ(d.at("no-batch-norm"), "0");
  EXPECT_EQ(d.at("init"), "kaiming-uniform");
  EXPECT_EQ(d.at("dataset"), "fashion-mnist");
  EXPECT_EQ(d.at("augment"), "auto");
  EXPECT_EQ(d.at("lr"), "0.1");
  EXPECT_EQ(d.at("weight-decay"), "0.0005");
  EXPECT_EQ(d.at("onecycle-final-div-factor"), "10000");
  EXPECT_EQ(d.at("lr-schedule"), "onecycle");
  EXPECT_EQ(d.at("lr-step-epochs"), "");
  EXPECT_EQ(d.at("device"), "auto");
  EXPECT_EQ(d.at("precision"), "tf32");
  EXPECT_EQ(d.at("init-from"), "");
  EXPECT_EQ(d.at("extend-epochs"), "0");
  EXPECT_EQ(d.at("jpeg-decode"), "auto");
  EXPECT_EQ(d.size(), 42u);
  const auto o = agreed_values(parse({"--lr-schedule", "step", "--lr-step-epochs", "1,2.5", "--no-nesterov"}));
  EXPECT_EQ(o.at("lr-step-epochs"), "1,2.5,");
  EXPECT_EQ(o.at("no-nesterov"), "1");
}

// A word that names no choice is refused with the choices, naming the option.
TEST(OptionTable, UnknownChoicesAreRefusedWithTheChoices) {
  const std::map<std::string, std::string> wanted{
      {"--model", "unknown model 'x' (choose mlp, cnn, resnet20, resnet18 or resnet50)"},
      {"--dataset", "unknown --dataset 'x' (choose fashion-mnist, mnist, cifar10, cifar100, shards or synthetic)"},
      {"--lr-schedule", "unknown --lr-schedule 'x' (choose constant, step, cosine or onecycle)"},
      {"--init", "unknown --init 'x' (choose kaiming-uniform or kaiming-normal)"},
      {"--augment", "unknown --augment 'x' (choose auto, on or off)"},
      {"--device", "unknown --device 'x' (choose auto, cpu or cuda)"},
      {"--precision", "unknown --precision 'x' (choose fp32, tf32, bf16 or fp16)"}};
  for (const auto& [option, message] : wanted) {
    try {
      parse({option, "x"});
      ADD_FAILURE() << option << " x was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
}

// Each command line refused as a usage error with exactly its message.
void expect_usage_errors(const std::map<std::vector<std::string>, std::string>& wanted) {
  for (const auto& [args, message] : wanted) {
    try {
      parse(args);
      ADD_FAILURE() << args[0] << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
}

// An option is named whole: Boost would take --res for --resume, which hpcrun (and slurm/job.sh)
// do not see, so hpcrun added --resume auto beside --res none and a run told to start afresh
// continued an old one, exit 0. A prefix is refused, naming what it begins.
TEST(OptionErrors, AnOptionIsNamedWhole) {
  const std::map<std::vector<std::string>, std::string> wanted{
      {{"--res", "none"}, "unrecognised option '--res' (options are named whole: --resume?)"},
      {{"--resum=none"}, "unrecognised option '--resum=none' (options are named whole: --resume?)"},
      {{"--checkpoint-e", "1"},
       "unrecognised option '--checkpoint-e' (options are named whole; it begins --checkpoint-every-steps, "
       "--checkpoint-each-epoch)"},
      {{"--reseme", "none"}, "unrecognised option '--reseme' (did you mean --resume?)"},
      {{"--bogus"}, "unrecognised option '--bogus'"}};
  expect_usage_errors(wanted);
}

// Boost fills its messages' placeholders (%canonical_option%, %value%, %option%, ...) in a loop
// that ends when none is left: a word holding its own placeholder made what() loop forever, and
// hpctrain hung on `--x%canonical_option%` or a config file's `epochs = %value%` instead of
// saying what was wrong (found by tests/fuzz/text_fuzz). Each is one usage error showing the
// word as given. (Without options::what_of these tests do not end: CTest's timeout fails them.)
TEST(OptionErrors, WordsHoldingBoostsPlaceholdersAreShownAsGiven) {
  const std::map<std::vector<std::string>, std::string> wanted{
      {{"--x%canonical_option%y", "1"}, "unrecognised option '--x%canonical_option%y'"},
      {{"--epochs", "%value%"}, "--epochs must be a whole number, got '%value%'"},
      {{"--no-overlap=%canonical_option%"}, "option '--no-overlap' does not take any arguments"},
      {{"--epochs=a%option%%original_token%%prefix%"}, "--epochs must be a whole number, got 'a%option%%original_token%%prefix%'"}};
  expect_usage_errors(wanted);
  const TempDir dir;
  const std::string path = dir.file("placeholders.conf");
  for (const auto& [line, message] : std::map<std::string, std::string>{
           {"a%canonical_option%b = 1", "unrecognised option 'a%canonical_option%b'"},
           {"epochs = %value%", "--epochs must be a whole number, got '%value%'"}}) {
    std::ofstream(path) << line << "\n";
    try {
      parse({"--config", path});
      ADD_FAILURE() << line << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "config file " + path + ": " + message);
    }
  }
}


// --jpeg-decode where nvJPEG is absent (this machine's CUDA toolkit has none) on a rank that
// trains on its GPU (gpu = true: the path a GPU machine without the library takes): gpu is one
// usage error naming the library and how to get it, auto decodes on the CPU; and the reasons
// before the library's, which need no GPU either.
TEST(JpegDecode, WithoutNvjpegGpuIsRefusedAndAutoDecodesOnTheCpu) {
  if (std::filesystem::exists("/usr/local/cuda/lib64/libnvjpeg.so.13")) GTEST_SKIP() << "nvJPEG is installed here";
  const train::TrainOptions shards_gpu = parse({"--dataset", "shards", "--jpeg-decode", "gpu"});
  try {
    train::resolve_jpeg_decode(shards_gpu, true, false);
    ADD_FAILURE() << "--jpeg-decode gpu without nvJPEG was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    const std::string m = e.what();
    EXPECT_NE(m.find("--jpeg-decode gpu: cannot load libnvjpeg.so.13"), std::string::npos) << m;
    EXPECT_NE(m.find("install CUDA's nvJPEG (package libnvjpeg-13-0)"), std::string::npos) << m;
    EXPECT_NE(m.find("--jpeg-decode cpu"), std::string::npos) << m;
  }
  // auto, the default: the CPU, said once
  EXPECT_FALSE(train::resolve_jpeg_decode(parse({"--dataset", "shards", "--jpeg-decode", "auto"}), true, true));
  EXPECT_FALSE(train::resolve_jpeg_decode(parse({"--dataset", "shards"}), true, false));
  EXPECT_FALSE(train::resolve_jpeg_decode(parse({"--dataset", "shards", "--jpeg-decode", "cpu"}), true, false));
  try {
    train::resolve_jpeg_decode(parse({"--dataset", "mnist", "--jpeg-decode", "gpu"}), true, false);
    ADD_FAILURE() << "--jpeg-decode gpu on MNIST was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the dataset is mnist, not packed JPEG shards"), std::string::npos) << m;
  }
  EXPECT_THROW(train::resolve_jpeg_decode(shards_gpu, false, false), Error);  // trains on the CPU
}

}  // namespace
}  // namespace hpc::testing
