// Tensors, the parameter arenas, the device caching allocator, errors, the checksum, the metrics lines
// and file identity.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/arena.hpp"
#include "core/caching_allocator.hpp"
#include "core/crash.hpp"
#include "core/cpus.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/duration.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "core/signal_safe_text.hpp"
#include "core/handle.hpp"
#include "core/option_kit.hpp"
#include "core/shared_library.hpp"
#include "core/spelling.hpp"
#include "core/standard_streams.hpp"
#include "core/tensor.hpp"
#include "train/observe/metrics.hpp"

namespace hpc {
namespace {

ErrorKind kind_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no hpc::Error thrown";
  return ErrorKind::Usage;
}

// ---- Tensor ----------------------------------------------------------------------------------

// A NUL byte from a file (a class name in classes.txt) in a message is written as \x00: what() is
// a C string, and the message ended at the NUL, before it said what was wrong.
TEST(Error, ANulByteDoesNotEndTheMessage) {
  try {
    usage_error("classes.txt names the classes ", std::string("cat\0x", 5), ", not those of the checkpoint");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "classes.txt names the classes cat\\x00x, not those of the checkpoint");
  }
}

// What predict and inspect print: one_line's escapes, and a backslash doubled so that a name
// holding a backslash and an n reads apart from one holding a newline.
TEST(Error, UnambiguousLinesDoubleTheBackslash) {
  EXPECT_EQ(one_line_unambiguous("a\nb"), "a\\nb");
  EXPECT_EQ(one_line_unambiguous("a\\nb"), "a\\\\nb");
  EXPECT_NE(one_line_unambiguous("a\nb"), one_line_unambiguous("a\\nb"));
  EXPECT_EQ(one_line_unambiguous("caf\xe9\t\\"), "caf\\xe9\\t\\\\");
}

// A byte that is not UTF-8 (a file's bytes, a Latin-1 name) and a C1 control are escaped as a
// control character is: they came out raw, a terminal's replacement glyph or a C1 escape, and a
// reader decoding the line as UTF-8 failed on it. Valid UTF-8 stays as it is.
TEST(Error, BytesThatAreNotUtf8AreEscaped) {
  EXPECT_EQ(one_line("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x90\x88"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x90\x88");
  EXPECT_EQ(one_line("caf\xe9"), "caf\\xe9");                        // Latin-1
  EXPECT_EQ(one_line("fashi\xff\xfenist"), "fashi\\xff\\xfenist");      // not UTF-8 at all
  EXPECT_EQ(one_line("a\xc2\x9b" "31m"), "a\\xc2\\x9b" "31m");         // U+009B, the C1 CSI
  EXPECT_EQ(one_line("cut \xe2\x82"), "cut \\xe2\\x82");                // a sequence cut short
  EXPECT_EQ(one_line("\xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80"),           // overlong, surrogate, past U+10FFFF
            "\\xc0\\xaf \\xed\\xa0\\x80 \\xf4\\x90\\x80\\x80");
  try {
    usage_error("unknown model '", std::string("ml\xffp"), "'");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown model 'ml\\xffp'");
  }
}

TEST(Tensor, ZeroFilledAndAligned) {
  Tensor t(Shape{3, 5, 7}, DType::F32);
  EXPECT_EQ(t.numel(), 105);
  EXPECT_EQ(t.bytes(), 420u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.data<float>()[i], 0.0f);
  EXPECT_EQ(Shape({2, 3}).str(), "[2, 3]");
  EXPECT_EQ(Shape().numel(), 1);
}

TEST(Tensor, ViewsAndReshapesShareStorage) {
  Tensor t = Tensor::zeros<double>(Shape{10});
  Tensor v = t.view(4, Shape{2, 3});
  v.data<double>()[0] = 5;
  EXPECT_EQ(t.data<double>()[4], 5);
  Tensor r = t.reshape(Shape{2, 5});
  EXPECT_EQ(r.data<double>()[4], 5);
  EXPECT_EQ(kind_of([&] { t.view(8, Shape{3}); }), ErrorKind::Internal);
  EXPECT_EQ(kind_of([&] { t.reshape(Shape{3, 3}); }), ErrorKind::Internal);
  EXPECT_EQ(kind_of([&] { t.data<float>(); }), ErrorKind::Internal);  // wrong dtype
}

TEST(Tensor, ResizeReusesStorageWhenLargeEnough) {
  Tensor t;
  t.resize<float>(Shape{4, 4});
  const void* p = t.raw();
  t.resize<float>(Shape{2, 3});
  EXPECT_EQ(t.raw(), p);
  EXPECT_EQ(t.shape(), Shape({2, 3}));
  t.resize<float>(Shape{100});
  EXPECT_EQ(t.numel(), 100);
  t.fill_zero();
  for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(t.data<float>()[i], 0.0f);
}

// ---- ParamStore ------------------------------------------------------------------------------

// Pinned host tensors (the GPU's batches of bytes): page-locked where a GPU is visible, plain
// host memory elsewhere; either way zero-filled, usable, and still asked for after a resize.
TEST(Tensor, PinnedIsHostMemoryEverywhereAndPageLockedWithAGpu) {
  const bool gpu = device::cuda_device_count() > 0;
  Tensor t = Tensor::pinned(Shape{3, 5}, DType::U8);
  EXPECT_EQ(t.device(), DeviceKind::CPU);
  EXPECT_EQ(t.pinned(), gpu);
  ASSERT_EQ(t.numel(), 15);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t.data<uint8_t>()[i], 0);
  t.data<uint8_t>()[14] = 7;
  t.resize<uint8_t>(Shape{1000});  // larger: new storage, asked for pinned again
  EXPECT_EQ(t.pinned(), gpu);
  EXPECT_EQ(t.data<uint8_t>()[999], 0);
  EXPECT_FALSE(Tensor(Shape{4}, DType::U8).pinned());
  EXPECT_THROW(Tensor::pinned(Shape{-1}, DType::U8), Error);
}

TEST(ParamStore, LaysOutParametersInOrderAligned) {
  ParamStore<float> s;
  EXPECT_EQ(s.add_param("a", Shape{3, 3}, ParamRole::Weight, 9), 0);
  EXPECT_EQ(s.add_param("b", Shape{3}, ParamRole::Bias), 1);
  EXPECT_EQ(s.add_param("c", Shape{40}, ParamRole::NormScale), 2);
  EXPECT_EQ(s.add_buffer("m", Shape{5}, 0.0), 0);
  EXPECT_EQ(s.add_buffer("v", Shape{5}, 1.0), 1);
  EXPECT_FALSE(s.allocated());
  s.allocate();
  EXPECT_TRUE(s.allocated());
  EXPECT_EQ(s.param_count(), 9 + 3 + 40);
  int64_t prev_end = 0;
  for (int i = 0; i < 3; ++i) {
    const auto& slot = s.slots()[i];
    EXPECT_GE(slot.offset, prev_end);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.value(i)) % 64, 0u) << slot.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.grad(i)) % 64, 0u) << slot.name;
    EXPECT_EQ(s.grad(i) - s.grads().data<float>(), s.value(i) - s.values().data<float>());
    prev_end = slot.offset + slot.shape.numel();
  }
  EXPECT_GE(s.values().numel(), prev_end);
  for (int j = 0; j < 5; ++j) {
    EXPECT_EQ(s.buffer(0)[j], 0.0f);
    EXPECT_EQ(s.buffer(1)[j], 1.0f);
  }
  EXPECT_EQ(kind_of([&] { s.add_param("late", Shape{1}, ParamRole::Bias); }), ErrorKind::Internal);
  EXPECT_EQ(kind_of([&] { s.allocate(); }), ErrorKind::Internal);
}

// ---- Errors ----------------------------------------------------------------------------------

TEST(Errors, KindsAndExitCodes) {
  try {
    usage_error("bad value ", 3, " for --x");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_STREQ(e.what(), "bad value 3 for --x");
  }
  try {
    HPC_CHECK(1 + 1 == 3, "math ", "broke");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
    EXPECT_EQ(e.exit_code(), 1);
    const std::string w = e.what();
    EXPECT_NE(w.find("core_test.cpp"), std::string::npos) << w;
    EXPECT_NE(w.find("1 + 1 == 3"), std::string::npos) << w;
    EXPECT_NE(w.find("math broke"), std::string::npos) << w;
  }
  EXPECT_EQ(kind_of([] { HPC_REQUIRE(false, "x"); }), ErrorKind::Usage);
  EXPECT_NO_THROW(HPC_REQUIRE(true, "x"));
  EXPECT_NO_THROW(HPC_CHECK(true));
}

// ---- Hash ------------------------------------------------------------------------------------

TEST(Hash, Fnv1aKnownAnswers) {
  EXPECT_EQ(fnv1a_hex("", 0), "cbf29ce484222325");
  EXPECT_EQ(fnv1a_hex("a", 1), "af63dc4c8601ec8c");
  EXPECT_EQ(fnv1a_hex("foobar", 6), "85944171f73967e8");
  EXPECT_EQ(fnv1a("foobar", 6), 0x85944171f73967e8ull);
  // Any changed bit changes it.
  float v[4] = {1, 2, 3, 4};
  const std::string before = fnv1a_hex(v, sizeof v);
  v[2] = std::nextafter(v[2], 10.0f);
  EXPECT_NE(fnv1a_hex(v, sizeof v), before);
}

// ---- Metrics lines ---------------------------------------------------------------------------

TEST(Metrics, JsonLineTypesAndEscapes) {
  using train::json_text;
  using train::JsonObject;
  EXPECT_EQ(json_text(JsonObject::object()), "{}");
  // Keys in the order given.
  EXPECT_EQ(json_text({{"event", std::string("epoch")}, {"epoch", int64_t{3}}, {"loss", 0.25}}),
            R"({"event":"epoch","epoch":3,"loss":0.25})");
  EXPECT_EQ(json_text({{"nan", NAN}, {"inf", -INFINITY}}), R"({"nan":null,"inf":null})");
  EXPECT_EQ(json_text({{"s", std::string("a\"b\\c\nd\te\x01")}}), R"({"s":"a\"b\\c\nd\te\u0001"})");
  // As many digits as the double needs to come back the same, and no more.
  EXPECT_EQ(json_text({{"x", 0.123456789012}}), R"({"x":0.123456789012})");
  EXPECT_EQ(json_text({{"x", 0.1}}), R"({"x":0.1})");
  // A double stays a double, an integer an integer, whatever the value.
  EXPECT_EQ(json_text({{"d", 2.0}, {"i", int64_t{2}}}), R"({"d":2.0,"i":2})");
  EXPECT_EQ(json_text({{"big", int64_t{1} << 40}}), R"({"big":1099511627776})");
  // A path may hold any bytes: those that are not UTF-8 are replaced, not refused.
  EXPECT_EQ(json_text({{"p", std::string("a\xff" "b")}}), "{\"p\":\"a\xEF\xBF\xBD" "b\"}");
  EXPECT_EQ(train::json_string("x\"y"), R"("x\"y")");
}

TEST(Metrics, WriterAppendsWholeLines) {
  const std::string path = (std::filesystem::temp_directory_path() / ("hpctrain-metrics-" + std::to_string(getpid()) + ".jsonl")).string();
  std::filesystem::remove(path);
  {
    train::MetricsWriter w(path, "--timeline-file");  // written as given (only the metrics file is stamped)
    w.write({{"a", int64_t{1}}});
    // Flushed as written: readable before the writer closes.
    std::ifstream in(path);
    std::string line;
    ASSERT_TRUE(std::getline(in, line));
    EXPECT_EQ(line, R"({"a":1})");
  }
  {
    train::MetricsWriter w(path, "--timeline-file");  // appends
    w.write({{"b", int64_t{2}}});
  }
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(all, "{\"a\":1}\n{\"b\":2}\n");
  std::filesystem::remove(path);
  {
    // The metrics file's writer stamps every event with the wall-clock time, last.
    const double before = static_cast<double>(std::time(nullptr));
    train::MetricsWriter w(path, "--metrics-file");
    w.write({{"c", int64_t{3}}});
    std::ifstream stamped(path);
    std::string line;
    ASSERT_TRUE(std::getline(stamped, line));
    const train::JsonObject o = train::JsonObject::parse(line);
    EXPECT_EQ(o.begin().key(), "c");
    EXPECT_EQ((++o.begin()).key(), "unix_time");
    EXPECT_GE(o.at("unix_time").get<double>(), before);
    EXPECT_LE(o.at("unix_time").get<double>(), before + 60);
  }
  std::filesystem::remove(path);
  train::MetricsWriter none;  // no file: writes nothing, no error
  EXPECT_NO_THROW(none.write({{"c", int64_t{3}}}));
  EXPECT_EQ(kind_of([] { train::MetricsWriter w("/nonexistent-dir/hpctrain/m.jsonl"); }), ErrorKind::Usage);
}

// Whether the file holds an event (as a resumed run asks of an epoch's): whole lines only, within
// the tail asked for; a line cut by a kill, one that is not JSON, or one with other values is not it.
TEST(Metrics, WriterFindsAWholeLineInItsFilesTail) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("hpctrain-holds-" + std::to_string(getpid()) + ".jsonl")).string();
  std::filesystem::remove(path);
  const train::JsonObject epoch2{{"event", "epoch"}, {"epoch", 2}, {"step", 40}};
  {
    std::ofstream out(path);
    out << R"({"event":"config"})" "\n" "not json\n" R"({"event":"epoch","epoch":1,"step":20,"train_loss":0.5})" "\n"
        << R"({"event":"epoch","epoch":2,"step":40)";  // cut by a kill
  }
  {
    train::MetricsWriter w(path, "--metrics-file");  // appends after a line end
    EXPECT_TRUE(w.holds({{"event", "epoch"}, {"epoch", 1}, {"step", 20}}, 1 << 20));
    EXPECT_FALSE(w.holds({{"event", "epoch"}, {"epoch", 1}, {"step", 21}}, 1 << 20));
    EXPECT_FALSE(w.holds(epoch2, 1 << 20)) << "the cut line is no event";
    w.write({{"event", "epoch"}, {"epoch", 2}, {"step", 40}});
    EXPECT_TRUE(w.holds(epoch2, 1 << 20));
    // A tail that starts inside a line leaves that line out; one that holds it whole finds it.
    std::ifstream in(path);
    const std::string all((std::istreambuf_iterator<char>(in)), {});
    const auto last = static_cast<int64_t>(all.size() - all.rfind('\n', all.size() - 2) - 1);
    EXPECT_TRUE(w.holds(epoch2, last));
    EXPECT_FALSE(w.holds(epoch2, last - 1));
    EXPECT_FALSE(w.holds({{"event", "config"}}, last)) << "the first line lies before the tail";
    EXPECT_TRUE(w.holds({{"event", "config"}}, 1 << 20));
  }
  std::filesystem::remove(path);
  train::MetricsWriter none;
  EXPECT_FALSE(none.holds(epoch2, 1 << 20));
  train::MetricsWriter stream("/dev/null", "--metrics-file");  // a device: never read back
  EXPECT_FALSE(stream.holds({}, 1 << 20));
}

}  // namespace
}  // namespace hpc

// ---- CachingAllocator (over a counting host backend; on a GPU it sits over cudaMalloc) --------

namespace hpc {
namespace {

struct CountingBackend {
  int64_t live = 0, calls = 0;
  size_t limit = SIZE_MAX, held = 0;
  bool refuse = false;  // as cudaFree while a CUDA graph is captured
  std::map<void*, size_t> blocks;
  CachingAllocator::Backend backend() {
    return {[this](size_t n) -> void* {
              ++calls;
              if (held + n > limit) return nullptr;
              void* p = std::malloc(n);
              blocks[p] = n;
              held += n;
              ++live;
              return p;
            },
            [this](void* p) {
              if (refuse) return false;
              held -= blocks.at(p);
              blocks.erase(p);
              std::free(p);
              --live;
              return true;
            }};
  }
};

TEST(CachingAllocator, RoundsSmallAndLargeRequests) {
  EXPECT_EQ(CachingAllocator::rounded(0), 512u);
  EXPECT_EQ(CachingAllocator::rounded(1), 512u);
  EXPECT_EQ(CachingAllocator::rounded(513), 1024u);
  EXPECT_EQ(CachingAllocator::rounded(1 << 20), size_t{1} << 20);
  EXPECT_EQ(CachingAllocator::rounded((1 << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(CachingAllocator::rounded((5 << 20) + 7), size_t{6} << 20);
}

TEST(CachingAllocator, ASecondStepAllocatesNothingFromTheBackend) {
  CountingBackend b;
  {
    CachingAllocator a(b.backend());
    const std::vector<size_t> step{100, 4096, 3 << 20, 700, 3 << 20};
    for (int round = 0; round < 3; ++round) {
      std::vector<void*> ptrs;
      for (size_t n : step) ptrs.push_back(a.allocate(n));
      for (size_t i = 0; i < ptrs.size(); ++i)
        for (size_t j = 0; j < i; ++j) EXPECT_NE(ptrs[i], ptrs[j]);
      for (void* p : ptrs) a.release(p);
    }
    const auto s = a.stats();
    EXPECT_EQ(s.backend_allocations, 5);
    EXPECT_EQ(s.cache_hits, 10);
    EXPECT_EQ(s.in_use, 0u);
    EXPECT_EQ(s.cached, 512u + 4096u + (4u << 20) * 2 + 1024u);
    EXPECT_EQ(s.peak_in_use, s.cached);
    EXPECT_EQ(b.live, 5);
  }
  EXPECT_EQ(b.live, 0) << "the destructor gives every block back";
}

// Without caching (HPCTRAIN_NO_MEMORY_CACHING=1) each request reaches the backend at its own
// size and each release goes straight back: a buffer ends where it was asked to end.
TEST(CachingAllocator, WithoutCachingEachBlockIsTheBackendsOwnAtItsSize) {
  CountingBackend b;
  {
    CachingAllocator a(b.backend(), /*caching=*/false);
    for (int round = 0; round < 2; ++round) {
      void* p = a.allocate(100);
      void* q = a.allocate(3 << 20);
      EXPECT_EQ(b.blocks.at(p), 100u);
      EXPECT_EQ(b.blocks.at(q), size_t{3} << 20);
      EXPECT_EQ(a.stats().in_use, 100u + (3u << 20));
      a.release(p);
      EXPECT_EQ(b.live, 1) << "given back at once";
      a.release(q);
    }
    void* z = a.allocate(0);
    EXPECT_EQ(b.blocks.at(z), 1u) << "a request of 0 takes one byte";
    a.release(z);
    EXPECT_EQ(a.stats().cached, 0u);
  }
  EXPECT_EQ(b.live, 0);
  EXPECT_EQ(b.calls, 5);
}

TEST(CachingAllocator, DoesNotHandOutABlockMoreThanTwiceTheRequest) {
  CountingBackend b;
  CachingAllocator a(b.backend());
  a.release(a.allocate(64 << 20));
  void* small = a.allocate(1000);
  EXPECT_EQ(a.stats().cached, size_t{64} << 20) << "the 64 MiB block stays for a large request";
  void* large = a.allocate(40 << 20);
  EXPECT_EQ(a.stats().cache_hits, 1);
  a.release(small);
  a.release(large);
}

TEST(CachingAllocator, OutOfMemoryEmptiesTheCacheThenFailsClearly) {
  CountingBackend b;
  b.limit = 10 << 20;
  CachingAllocator a(b.backend());
  a.release(a.allocate(6 << 20));  // cached, but too small for the next request
  void* p = a.allocate(8 << 20);    // fits only once the cached block is given back
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(a.stats().cached, 0u);
  try {
    a.allocate(4 << 20);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("out of GPU memory allocating 4 MiB (8 MiB already in use)"),
              std::string::npos)
        << e.what();
  }
  a.release(p);
  EXPECT_THROW(a.release(reinterpret_cast<void*>(0x1000)), Error);
}

// cudaFree refused (a CUDA graph being captured): what the cache could not give back stays
// cached, counted and handed out again, never forgotten (leaked), and is given back once the
// driver takes it; the out-of-memory error says how much was held back. Without caching too.
TEST(CachingAllocator, ABlockTheBackendRefusesToTakeBackStaysCached) {
  for (bool caching : {true, false}) {
    SCOPED_TRACE(caching ? "caching" : "no caching");
    CountingBackend b;
    b.limit = 10 << 20;
    {
      CachingAllocator a(b.backend(), caching);
      void* p = a.allocate(6 << 20);
      b.refuse = true;
      a.release(p);
      EXPECT_EQ(a.stats().cached, size_t{6} << 20);
      try {
        a.allocate(8 << 20);
        FAIL() << "expected an out-of-memory error";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Usage);
        EXPECT_NE(std::string(e.what()).find("(0 MiB already in use, 6 MiB cached that the driver would not take "
                                             "back now)"),
                  std::string::npos)
            << e.what();
      }
      EXPECT_EQ(a.stats().cached, size_t{6} << 20) << "still cached after the refused fallback";
      EXPECT_EQ(b.live, 1);
      if (caching) {
        void* again = a.allocate(5 << 20);
        EXPECT_EQ(again, p) << "the refused block is handed out again";
        a.release(again);
      }
      b.refuse = false;
      a.empty_cache();
      EXPECT_EQ(a.stats().cached, 0u);
      EXPECT_EQ(b.live, 0) << "given back once the backend takes it";
      void* q = a.allocate(8 << 20);
      EXPECT_NE(q, nullptr);
      a.release(q);
    }
    EXPECT_EQ(b.live, 0);
  }
}

}  // namespace
}  // namespace hpc

// ---- The CPUs a process may use ------------------------------------------------------------

namespace hpc {
namespace {

// A fake /proc/self/cgroup and /sys/fs/cgroup in a temporary directory.
class CgroupTree {
 public:
  CgroupTree() : root_(std::filesystem::temp_directory_path() / ("hpctrain-cgroup-" + std::to_string(getpid()))) {
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ / "fs");
  }
  ~CgroupTree() { std::filesystem::remove_all(root_); }
  void write(const std::string& rel, const std::string& text) {
    const auto p = rel == "proc" ? root_ / "proc" : root_ / "fs" / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::optional<double> quota() const { return cpus::cgroup_quota((root_ / "proc").string(), (root_ / "fs").string()); }
  std::optional<double> memory() const {
    return cpus::cgroup_memory_limit((root_ / "proc").string(), (root_ / "fs").string());
  }

 private:
  std::filesystem::path root_;
};

TEST(Cpus, CgroupV2QuotaIsTheTightestAlongThePath) {
  CgroupTree t;
  t.write("proc", "0::/job/step\n");
  t.write("job/step/cpu.max", "max 100000\n");
  EXPECT_FALSE(t.quota()) << "no quota: 'max'";
  t.write("job/cpu.max", "250000 100000\n");  // the parent's limit binds the child
  EXPECT_DOUBLE_EQ(*t.quota(), 2.5);
  t.write("job/step/cpu.max", "150000 100000\n");
  EXPECT_DOUBLE_EQ(*t.quota(), 1.5);
}

TEST(Cpus, CgroupV1QuotaFromCfsFiles) {
  CgroupTree t;
  t.write("proc", "12:memory:/x\n4:cpu,cpuacct:/docker/abc\n");
  t.write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");
  t.write("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  EXPECT_FALSE(t.quota()) << "-1: none";
  t.write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "300000\n");
  EXPECT_DOUBLE_EQ(*t.quota(), 3.0);
}

// The memory limit the snapshots' budget is a share of: v2's memory.max along the path, v1's
// memory.limit_in_bytes of the memory controller (a huge value: none).
TEST(Cpus, CgroupMemoryLimitV2AndV1) {
  CgroupTree t;
  t.write("proc", "0::/job/step\n");
  t.write("job/step/memory.max", "max\n");
  EXPECT_FALSE(t.memory());
  t.write("job/memory.max", "4294967296\n");
  EXPECT_DOUBLE_EQ(*t.memory(), 4294967296.0);
  t.write("job/step/memory.max", "1073741824\n");
  EXPECT_DOUBLE_EQ(*t.memory(), 1073741824.0);
  CgroupTree v1;
  v1.write("proc", "4:cpu,cpuacct:/a\n9:memory:/slurm/job7\n");
  v1.write("memory/slurm/job7/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_FALSE(v1.memory()) << "2^63 - 4096: none";
  v1.write("memory/slurm/memory.limit_in_bytes", "2147483648\n");
  EXPECT_DOUBLE_EQ(*v1.memory(), 2147483648.0);
  EXPECT_FALSE(v1.quota()) << "the cpu controller's files are not the memory's";
}

TEST(Cpus, NoCgroupFilesNoQuota) {
  CgroupTree t;
  EXPECT_FALSE(t.quota());
  t.write("proc", "0::/\n");
  EXPECT_FALSE(t.quota());
}

TEST(Cpus, FairShareCountsCpusSharedByOverlappingMasks) {
  // Two ranks bound to their own cores each have theirs; two on one socket share it.
  EXPECT_DOUBLE_EQ(cpus::fair_share({{0, 1}, {2, 3}}, 0), 2);
  EXPECT_DOUBLE_EQ(cpus::fair_share({{0, 1, 2, 3}, {0, 1, 2, 3}}, 1), 2);
  EXPECT_DOUBLE_EQ(cpus::fair_share({{0, 1, 2, 3}, {0, 1, 2, 3}, {4, 5}}, 2), 2);
  EXPECT_DOUBLE_EQ(cpus::fair_share({{0}}, 0), 1);
  EXPECT_GE(cpus::usable(), 1);
  EXPECT_FALSE(cpus::affinity().empty());
}

// The crash reporter, installed twice (or over itself), still ends the process by the signal:
// it must not hand the signal on to itself, which would make it come back for ever.
TEST(CrashReporter, InstalledTwiceACrashStillEndsTheProcess) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(10);  // a reporter that re-enters itself would spin until this
    setenv("HPCTRAIN_TEST_CRASH", "null-call", 1);
    crash::install_reporter();
    crash::install_reporter();
    crash::crash_if_asked();
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
}

// A process started without its standard output and error (`>&- 2>&-`) and with standard input
// closed: each number is held, writes to the outputs and reads of the input still fail (EBADF),
// and a file opened next gets a number of its own. (Left free, that file took number 0, and what
// the process printed went into it.) In a child, whose streams are its own to close.
TEST(StandardStreams, ClosedOnesAreHeldSoNoFileTakesTheirNumbers) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(10);
    for (int fd = 0; fd <= 2; ++fd) ::close(fd);
    hold_closed_standard_streams();
    int code = 0;
    for (int fd = 0; fd <= 2; ++fd)
      if (::fcntl(fd, F_GETFD) == -1) code |= 1;  // not held
    char c = 'x';
    if (::write(STDOUT_FILENO, &c, 1) != -1 || errno != EBADF) code |= 2;
    if (::write(STDERR_FILENO, &c, 1) != -1 || errno != EBADF) code |= 4;
    if (::read(STDIN_FILENO, &c, 1) != -1 || errno != EBADF) code |= 8;
    const int file = ::open("/dev/null", O_RDWR);
    if (file <= STDERR_FILENO) code |= 16;
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: a number left free, 2/4: an output writable, 8: input readable, "
                                       "16: a file took a standard number";
}

// Streams that are open are left as they are.
TEST(StandardStreams, OpenOnesAreLeftAlone) {
  struct stat before {}, after {};
  ASSERT_EQ(::fstat(STDOUT_FILENO, &before), 0);
  hold_closed_standard_streams();
  ASSERT_EQ(::fstat(STDOUT_FILENO, &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_EQ(before.st_dev, after.st_dev);
}

// A typo is one or two letters wrong, left out, added or swapped; a word far from every name has
// no suggestion (a wrong one would mislead more than none).
TEST(Spelling, NearestNameIsATypoAway) {
  const std::vector<std::string> commands{"train", "evaluate", "inspect", "export", "predict"};
  EXPECT_EQ(nearest_name(commands, "evalute"), "evaluate");  // a letter left out
  EXPECT_EQ(nearest_name(commands, "inpsect"), "inspect");   // two swapped
  EXPECT_EQ(nearest_name(commands, "exprot"), "export");
  EXPECT_EQ(nearest_name(commands, "tran"), "train");
  EXPECT_EQ(nearest_name(commands, "tarin"), "train");  // two swapped, in a word short enough to allow one edit
  EXPECT_EQ(nearest_name(commands, "resnet20"), "");
  EXPECT_EQ(nearest_name(commands, "x"), "");
  EXPECT_EQ(nearest_name({}, "train"), "");
  EXPECT_EQ(did_you_mean(commands, "predcit"), " (did you mean predict?)");
  EXPECT_EQ(did_you_mean(commands, "bogus"), "");
}

}  // namespace
}  // namespace hpc

// ---- FileIdentity (core/file_identity.hpp) ----------------------------------------------------

namespace hpc {
namespace {

namespace fs = std::filesystem;

class FileIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hpctrain-identity-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "sub");
    std::ofstream(dir_ / "x") << "bytes";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string at(const std::string& rel) const { return (dir_ / rel).string(); }
  fs::path dir_;
};

// Every spelling and link of one existing file is that file; another file is not.
TEST_F(FileIdentityTest, AnExistingFileByAnySpellingOrLink) {
  fs::create_symlink(at("x"), at("link"));
  fs::create_symlink("link", at("link-to-link"));  // relative, and a chain
  fs::create_hard_link(at("x"), at("hard"));
  std::ofstream(at("y")) << "bytes";
  for (const char* other : {"x", "./x", "sub/../x", "link", "link-to-link", "hard", ".//x"})
    EXPECT_TRUE(same_file(at("x"), at(other))) << other;
  EXPECT_FALSE(same_file(at("x"), at("y")));
  EXPECT_FALSE(same_file(at("x"), at("sub")));
  EXPECT_FALSE(same_file(at("x"), ""));
}

// A file not there yet is its directory and name: spellings of one directory, and a dangling
// link (a write creates its target), name the same file.
TEST_F(FileIdentityTest, AFileNotThereYetByItsDirectoryAndName) {
  fs::create_symlink("t.jsonl", at("dangling"));
  fs::create_directory_symlink(at("sub"), at("sublink"));
  EXPECT_TRUE(same_file(at("t.jsonl"), at("./t.jsonl")));
  EXPECT_TRUE(same_file(at("t.jsonl"), at("sub/../t.jsonl")));
  EXPECT_TRUE(same_file(at("t.jsonl"), at("dangling")));
  EXPECT_TRUE(same_file(at("sub/t.jsonl"), at("sublink/t.jsonl")));
  EXPECT_FALSE(same_file(at("t.jsonl"), at("u.jsonl")));
  EXPECT_FALSE(same_file(at("t.jsonl"), at("sub/t.jsonl")));
  EXPECT_FALSE(same_file(at("x"), at("x.new")));
  EXPECT_FALSE(same_file(at("no/t.jsonl"), at("no/t.jsonl")));  // nothing to tell by: its opener reports it
  const std::string cwd = fs::current_path().string();
  fs::current_path(dir_);
  EXPECT_TRUE(same_file("t.jsonl", at("t.jsonl")));  // relative: to the working directory
  fs::current_path(cwd);
}

// A link is followed as the kernel follows it: "../" in a target goes up from where the folder
// before it leads, not from the link's spelling (written through for --prometheus-file).
TEST_F(FileIdentityTest, ALinksTargetIsReadAsTheKernelReadsIt) {
  fs::create_directories(at("real/deep"));
  fs::create_directory_symlink("real/deep", at("into"));
  fs::create_symlink("into/../t.prom", at("m.prom"));  // the kernel: real/t.prom
  fs::create_symlink("m.prom", at("chain"));
  fs::create_symlink("loop-b", at("loop-a"));
  fs::create_symlink("loop-a", at("loop-b"));
  for (const char* link : {"m.prom", "chain"}) {
    const std::string end = through_links(at(link));
    std::ofstream(end) << "x";
    EXPECT_TRUE(fs::exists(at("real/t.prom"))) << link << " led to " << end;
    EXPECT_FALSE(fs::exists(at("t.prom"))) << link << " led to " << end;
    fs::remove(at("real/t.prom"));
    fs::remove(at("t.prom"));
  }
  EXPECT_EQ(through_links(at("x")), at("x"));
  EXPECT_EQ(through_links(at("loop-a")), at("loop-a"));  // no end within the kernel's 40 links
}

// Streams are shared by intent and hold no input's bytes; identity never opens them (a FIFO
// without a writer would block an open forever).
TEST_F(FileIdentityTest, StreamsAreNeverTheSameFileAndNeverOpened) {
  ASSERT_EQ(::mkfifo(at("fifo").c_str(), 0600), 0);
  EXPECT_TRUE(file_identity(at("fifo")) && file_identity(at("fifo"))->stream);
  EXPECT_FALSE(same_file(at("fifo"), at("fifo")));
  EXPECT_FALSE(same_file("/dev/stdout", "/dev/stdout"));
  EXPECT_FALSE(same_file("/dev/stdout", "/dev/stderr"));
  EXPECT_FALSE(same_file("/dev/null", "/dev/null"));
}

TEST_F(FileIdentityTest, DistinctFilesNameBothOrPass) {
  fs::create_symlink(at("x"), at("link"));
  try {
    require_distinct_files({{"--output", at("link")}}, {{"--checkpoint", at("x")}});
    ADD_FAILURE() << "an output that is an input was allowed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    const std::string w = e.what();
    EXPECT_NE(w.find("--output " + at("link") + " is the same file as --checkpoint " + at("x")), std::string::npos)
        << w;
  }
  try {
    require_distinct_files({{"--metrics-file", at("m")}, {"--timeline-file", at("./m")}}, {});
    ADD_FAILURE() << "two outputs in one file were allowed";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("--metrics-file " + at("m") + " and --timeline-file " + at("./m") + " are the same file"),
              std::string::npos) << w;
  }
  EXPECT_NO_THROW(require_distinct_files({{"--metrics-file", "/dev/stdout"}, {"--timeline-file", "/dev/stdout"},
                                          {"--prometheus-file", ""}, {"--output", at("y")}},
                                         {{"--checkpoint", at("x")}, {"--config", ""}}));
}

TEST_F(FileIdentityTest, RootDirectoryBySpellingOrLinkIsRefused) {
  fs::create_directory_symlink("/", at("root-link"));
  for (const std::string& root : {std::string("/"), std::string("//"), std::string("/tmp/.."), std::string("/."),
                                  at("root-link")})
    EXPECT_EQ(kind_of([&] { require_not_root_dir(root, "--out"); }), ErrorKind::Usage) << root;
  try {
    require_not_root_dir("/", "--checkpoint-dir");
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "--checkpoint-dir / is the root directory / (an unset variable?): give a directory of its own");
  }
  for (const std::string& fine : {std::string(""), at("sub"), at("missing"), std::string("/tmp")})
    EXPECT_NO_THROW(require_not_root_dir(fine, "--out")) << fine;
}

// What error a check throws: its text, or "" when it passes.
template <class F>
std::string refusal(F&& check) {
  try {
    check();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    return e.what();
  }
  return "";
}

// A directory whose files are read back must be out of other users' reach: refused where another
// user owns it or a directory above it, or where every user may write to it (or above it, unless
// sticky); root is trusted, and so is a group. Needs root, to give directories to other users.
TEST_F(FileIdentityTest, ADirectoryInOtherUsersReachIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (chown to other users); CI runs as root";
  const uid_t me = 4242, other = 4343;
  // Owned by `owner` and its group of the same number (no group of this process's, but root's).
  auto make = [&](const std::string& rel, mode_t mode, uid_t owner, gid_t group = gid_t(-1)) {
    fs::create_directories(at(rel));
    EXPECT_EQ(::chmod(at(rel).c_str(), mode), 0);
    EXPECT_EQ(::chown(at(rel).c_str(), owner, group == gid_t(-1) ? static_cast<gid_t>(owner) : group), 0);
  };
  auto check = [&](const std::string& rel, uid_t uid) {
    return refusal([&] { require_safe_directory(at(rel), "--checkpoint-dir", uid); });
  };
  make("mine", 0755, me);
  make("team", 0775, me);             // group write: a team's directory
  make("roots", 0755, 0);             // root's
  make("theirs", 0755, other);
  make("theirs/mine", 0755, me);      // mine, inside another user's
  make("open", 0777, me);
  make("open/mine", 0755, me);        // mine, inside one every user may write to
  make("sticky", 01777, 0);
  make("sticky/mine", 0700, me);      // mine, inside a sticky one (as /tmp or /shared)
  make("project", 02775, other, ::getegid());  // a PI's project directory, of a group of this process's
  make("project/mine", 0755, me);
  fs::create_directory_symlink(at("theirs"), at("link"));
  for (const char* fine : {"mine", "team", "roots", "sticky/mine", "project/mine", "missing", "sticky/missing/too"})
    EXPECT_EQ(check(fine, me), "") << fine;
  EXPECT_EQ(check("theirs", other), "");  // its owner's
  EXPECT_EQ(check("theirs", 0), "");      // root trusts every owner

  EXPECT_EQ(check("theirs", me), "--checkpoint-dir " + at("theirs") +
                                     ": it belongs to uid 4343, another user, not of your groups: another user "
                                     "could replace what is "
                                     "read back there, or plant a link that a write would follow; use a directory "
                                     "of your own");
  EXPECT_NE(check("theirs/mine", me).find(": " + at("theirs") + " belongs to uid 4343"), std::string::npos);
  EXPECT_NE(check("link", me).find("--checkpoint-dir " + at("link") + " (" + at("theirs") + "): it belongs"),
            std::string::npos) << check("link", me);
  for (uid_t uid : {me, uid_t{0}}) {
    EXPECT_NE(check("open", uid).find(": it is writable by others (mode 777): "), std::string::npos) << uid;
    EXPECT_NE(check("open", uid).find("; chmod o-w it, or use a directory of your own"), std::string::npos) << uid;
    EXPECT_NE(check("open/mine", uid).find(": " + at("open") + " is writable by others (mode 777)"),
              std::string::npos);
    EXPECT_NE(check("sticky", uid).find(": it is writable by others (mode 1777)"), std::string::npos) << uid;
    // Not there yet: judged by the folders it would be made in (another user could make it first).
    for (const char* missing : {"open/missing", "open/missing/too"})
      EXPECT_NE(check(missing, uid).find(": " + at("open") + " is writable by others (mode 777)"), std::string::npos)
          << missing;
  }
  EXPECT_NE(check("theirs/missing", me).find(": " + at("theirs") + " belongs to uid 4343"), std::string::npos);
}

// A file that decides what runs or where (hpcrun's discovery script, its hostfile): refused where
// another user owns it (for root too) or a link of its last part, or every user may write to it or
// to a folder above it that is not sticky; a sticky folder (/tmp) is fine all the way down, as are
// a group's files. Needs root, to give files to other users.
TEST_F(FileIdentityTest, AFileInOtherUsersReachIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (chown to other users); CI runs as root";
  const uid_t me = 4242, other = 4343;
  auto own = [&](const std::string& rel, mode_t mode, uid_t owner) {
    EXPECT_EQ(::chmod(at(rel).c_str(), mode), 0);
    EXPECT_EQ(::lchown(at(rel).c_str(), owner, owner), 0);
  };
  auto file = [&](const std::string& rel, mode_t mode, uid_t owner) {
    std::ofstream(at(rel)) << "localhost slots=1\n";
    own(rel, mode, owner);
  };
  auto check = [&](const std::string& rel, uid_t uid) {
    return refusal([&] { require_safe_file(at(rel), "--hostfile", uid); });
  };
  fs::create_directories(at("sticky/sticky"));
  own("sticky", 01777, 0);
  own("sticky/sticky", 01777, me);
  fs::create_directories(at("open"));
  own("open", 0777, me);
  file("mine", 0644, me);
  file("team", 0664, me);
  file("sticky/sticky/mine", 0600, me);
  file("written", 0646, me);
  file("theirs", 0644, other);
  file("open/mine", 0644, me);
  fs::create_symlink(at("mine"), at("sticky/my_link"));
  EXPECT_EQ(::lchown(at("sticky/my_link").c_str(), me, me), 0);
  fs::create_symlink(at("mine"), at("sticky/their_link"));
  EXPECT_EQ(::lchown(at("sticky/their_link").c_str(), other, other), 0);
  for (const char* fine : {"mine", "team", "sticky/sticky/mine", "sticky/my_link", "missing"})
    EXPECT_EQ(check(fine, me), "") << fine;
  EXPECT_EQ(check("theirs", other), "");
  EXPECT_NE(check("written", me).find(": it is writable by others (mode 646): "), std::string::npos);
  EXPECT_NE(check("open/mine", me).find(": " + at("open") + " is writable by others (mode 777) and not sticky"),
            std::string::npos);
  EXPECT_EQ(check("theirs", me), "--hostfile " + at("theirs") + ": it belongs to uid 4343, another user, not of "
                                 "your groups: another user could change what is read or run from it; use a file "
                                 "of your own");
  EXPECT_NE(check("sticky/their_link", me).find("--hostfile " + at("sticky/their_link") + ": the link " +
                                               at("sticky/their_link") + " belongs to uid 4343"),
            std::string::npos);
  // Root trusts no other user's file: its owner could rewrite it (sshd's rule for authorized_keys).
  EXPECT_NE(check("theirs", 0).find(": it belongs to uid 4343"), std::string::npos);
  EXPECT_NE(check("mine", 0).find(": it belongs to uid 4242"), std::string::npos);
  EXPECT_NE(check("sticky/their_link", 0).find(": the link "), std::string::npos);
  file("roots", 0646, 0);
  EXPECT_NE(check("roots", 0).find(": it is writable by others (mode 646)"), std::string::npos);
}

// make_directories makes each missing part with the mode given less the umask (never 0777 under
// umask 000, as create_directories did), part by part as written ("a/b/../c" is a, a/b and a/c,
// as mkdir -p), leaves one that is there as it is, and fails on a part that is a file.
TEST_F(FileIdentityTest, MakeDirectoriesGivesEachPartTheModeAndFollowsTheWrittenPath) {
  std::error_code ec;
  const mode_t umask_before = ::umask(0);
  const bool made = make_directories(at("a/b/../c/"), kSharedDirectoryMode, ec);
  const bool kept = make_directories(at("sub"), 0700, ec);
  ::umask(umask_before);
  ASSERT_TRUE(made) << ec.message();
  EXPECT_TRUE(kept);
  for (const char* part : {"a", "a/b", "a/c"})
    EXPECT_EQ(fs::status(at(part)).permissions(), fs::perms(0775)) << part;
  EXPECT_NE(fs::status(at("sub")).permissions(), fs::perms(0700));  // there already: left as it was
  EXPECT_FALSE(make_directories(at("x/y"), 0755, ec));
  EXPECT_EQ(ec, std::make_error_code(std::errc::not_a_directory));
  EXPECT_FALSE(fs::exists(at("x/y")));
  // A link to nothing on the way is no directory either: mkdir's EEXIST, not the ENOENT of the
  // stat that looked again (a part that is there, said to be missing).
  fs::create_symlink(at("nowhere"), at("dangling"));
  EXPECT_FALSE(make_directories(at("dangling/y"), 0755, ec));
  EXPECT_EQ(ec, std::make_error_code(std::errc::not_a_directory)) << ec.message();
  EXPECT_FALSE(fs::exists(at("nowhere")));
}

// An output's path in a sticky folder every user may write to (/tmp): a link, file or FIFO there
// of another user (not the folder's owner) is refused, whether the kernel's protected_symlinks is
// set or not (a dangling link is followed by open_output itself); this user's own, or one in a
// folder of its own, is followed and written as before. Needs root, to give entries to others.
TEST_F(FileIdentityTest, AnOutputPlantedByAnotherUserInASharedFolderIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (chown to other users); CI runs as root";
  const uid_t other = 4343;
  auto folder = [&](const std::string& rel, mode_t mode, uid_t owner) {
    fs::create_directories(at(rel));
    EXPECT_EQ(::chmod(at(rel).c_str(), mode), 0);
    EXPECT_EQ(::chown(at(rel).c_str(), owner, owner), 0);
  };
  auto link = [&](const std::string& target, const std::string& rel, uid_t owner) {
    fs::create_symlink(target, at(rel));
    EXPECT_EQ(::lchown(at(rel).c_str(), owner, owner), 0);
  };
  auto open = [&](const std::string& rel) {
    return refusal([&] { ::close(open_output(at(rel), "--metrics-file", O_WRONLY | O_APPEND).fd); });
  };
  folder("tmp", 01777, 0);       // as /tmp: root's, sticky, every user's to write
  folder("theirs", 01777, other);  // sticky too, but the other user's own
  folder("mine", 0755, 0);
  link("victim.jsonl", "tmp/dangling", other);  // to a file not there yet: the run would create it
  std::ofstream(at("tmp/victim2.jsonl")) << "precious\n";
  link(at("tmp/victim2.jsonl"), "tmp/to-a-file", other);
  std::ofstream(at("tmp/their.jsonl")) << "theirs\n";
  EXPECT_EQ(::chown(at("tmp/their.jsonl").c_str(), other, other), 0);
  ASSERT_EQ(::mkfifo(at("tmp/fifo").c_str(), 0666), 0);
  EXPECT_EQ(::chown(at("tmp/fifo").c_str(), other, other), 0);
  link("dangling", "tmp/mine-to-theirs", 0);  // this user's link, to theirs

  EXPECT_EQ(open("tmp/dangling"), "refusing --metrics-file " + at("tmp/dangling") + ": the link " +
                                      at("tmp/dangling") + " belongs to uid 4343 in " + at("tmp") +
                                      " (mode 1777, writable by every user): another user may have put it there for "
                                      "this run to follow or write into; use a path of your own");
  EXPECT_FALSE(fs::exists(at("tmp/victim.jsonl")));
  EXPECT_NE(open("tmp/to-a-file").find(": the link " + at("tmp/to-a-file") + " belongs to uid 4343"),
            std::string::npos);
  EXPECT_NE(open("tmp/their.jsonl").find(": the file " + at("tmp/their.jsonl") + " belongs to uid 4343"),
            std::string::npos);
  EXPECT_NE(open("tmp/fifo").find(": the FIFO " + at("tmp/fifo") + " belongs to uid 4343"), std::string::npos);
  EXPECT_NE(open("tmp/mine-to-theirs").find(": the link " + at("tmp/dangling") + " belongs to uid 4343"),
            std::string::npos);
  std::string kept;
  std::getline(std::ifstream(at("tmp/victim2.jsonl")), kept);
  EXPECT_EQ(kept, "precious");
  std::getline(std::ifstream(at("tmp/their.jsonl")), kept);
  EXPECT_EQ(kept, "theirs");

  // Followed: this user's link in the shared folder, another user's link in a folder of this
  // user's, and the folder owner's own link in its sticky folder.
  link("mine.jsonl", "tmp/my-link", 0);
  link("new.jsonl", "mine/their-link", other);
  link("own.jsonl", "theirs/owners-link", other);
  for (const char* fine : {"tmp/my-link", "mine/their-link", "theirs/owners-link", "tmp/plain.jsonl"})
    EXPECT_EQ(open(fine), "") << fine;
  for (const char* made : {"tmp/mine.jsonl", "mine/new.jsonl", "theirs/own.jsonl", "tmp/plain.jsonl"})
    EXPECT_TRUE(fs::is_regular_file(at(made))) << made;
}

}  // namespace
}  // namespace hpc

namespace hpc::testing {
namespace {

// Every command line's durations show their default as duration_text writes it: what a person
// writes ("10m", not "600 s"), read back by parse_duration as the same seconds.
TEST(OptionKit, DurationTextIsWhatPeopleWriteAndReadsBackTheSame) {
  const std::vector<std::pair<double, std::string>> shown{
      {0, "0"}, {0.5, "0.5s"}, {5, "5s"}, {30, "30s"}, {90, "90s"}, {60, "1m"}, {120, "2m"}, {300, "5m"},
      {600, "10m"}, {5400, "90m"}, {3600, "1h"}, {7200, "2h"}, {0.1, "0.1s"}, {1234567, "1234567s"}};
  for (const auto& [seconds, text] : shown) {
    EXPECT_EQ(options::duration_text(seconds), text) << seconds;
    EXPECT_EQ(parse_duration(options::duration_text(seconds), "x"), seconds) << text;
  }
}

// Durations in messages: three significant digits in the unit that suits, and whole numbers
// past 999 (an error said "got 1e+03 h" of --step-timeout 1001h).
TEST(Duration, ShownInTheUnitThatSuits) {
  const std::vector<std::pair<double, std::string>> shown{
      {0.25, "0.25 s"}, {90, "90 s"}, {119.4, "119 s"}, {600, "10 min"}, {5400, "90 min"}, {7200, "2 h"},
      {3603600, "1001 h"}, {36000000, "10000 h"}, {3600 * 999.6, "1000 h"}};
  for (const auto& [seconds, text] : shown) EXPECT_EQ(show_duration(seconds), text) << seconds;
}

// core/handle.hpp, as the GPU code holds cuDNN descriptors, streams and events: each handle is
// destroyed once, by its owner's end, a reset, or a new create through out(); a move hands it on.
int destroyed[4] = {};
void destroy_slot(int* h) { ++destroyed[*h]; }
TEST(Handle, EachHandleIsDestroyedOnceByWhoeverHoldsItLast) {
  static int slots[4] = {0, 1, 2, 3};
  using H = Handle<int*, destroy_slot>;
  {
    H a;
    EXPECT_FALSE(a);
    *a.out() = &slots[1];
    EXPECT_TRUE(a);
    H b(std::move(a));
    EXPECT_FALSE(a);
    EXPECT_EQ(b.get(), &slots[1]);
    EXPECT_EQ(destroyed[1], 0) << "a move destroys nothing";
    *b.out() = &slots[2];  // a new create: the old one goes first
    EXPECT_EQ(destroyed[1], 1);
    H c;
    *c.out() = &slots[3];
    c = std::move(b);  // c's own goes, b's moves in
    EXPECT_EQ(destroyed[3], 1);
    EXPECT_EQ(destroyed[2], 0);
    c.reset();
    EXPECT_EQ(destroyed[2], 1);
    c.reset();  // nothing held: nothing destroyed
    *c.out() = &slots[0];
  }
  EXPECT_EQ(destroyed[0], 1) << "the owner's end destroys what it holds";
  EXPECT_EQ(destroyed[1] + destroyed[2] + destroyed[3], 3) << "each destroyed once";
}

// A required path and a list of words, as the subcommands use them: the list takes its words
// as separate tokens or as positional arguments and its value text reads back as the same list;
// a command line without the required one is refused.
TEST(OptionKit, ARequiredPathAndAListOfWords) {
  struct S {
    std::string checkpoint;
    std::vector<std::string> words;
  };
  const std::vector<options::Entry<S>> table{
      options::path("checkpoint", &S::checkpoint, "c", options::Presence::Required),
      options::list("words", &S::words, "w")};
  auto parse = [&](std::vector<const char*> argv, S& s) {
    namespace po = boost::program_options;
    po::options_description d;
    options::add(table, d, s);
    po::positional_options_description positional;
    positional.add("words", -1);
    argv.insert(argv.begin(), "prog");
    po::variables_map vm;
    po::store(
        po::command_line_parser(static_cast<int>(argv.size()), argv.data()).options(d).positional(positional).run(),
        vm);
    po::notify(vm);
    options::read(table, vm, s);
  };
  S s;
  parse({"--checkpoint", "ck", "a b", "c", "--words", "d"}, s);
  EXPECT_EQ(s.checkpoint, "ck");
  EXPECT_EQ(s.words, (std::vector<std::string>{"a b", "c", "d"}));
  S back;
  table[1].parse(table[1].value(s), back);
  EXPECT_EQ(back.words, s.words);
  S missing;
  EXPECT_THROW(parse({"x"}, missing), boost::program_options::required_option);
}

// A word that is no option nor an option's value, beyond what the positional arguments take, is
// named (Boost's "too many positional options" names none): values of options are skipped, in
// either form, negative numbers among them; flags take no value; other errors keep Boost's text.
TEST(OptionKit, AStrayWordIsNamed) {
  namespace po = boost::program_options;
  po::options_description d;
  d.add_options()("lr", po::value<double>())("name", po::value<std::string>())("quiet", po::bool_switch());
  const auto text = [&](std::vector<const char*> argv, const po::positional_options_description& positional) {
    argv.insert(argv.begin(), "prog");
    const int argc = static_cast<int>(argv.size());
    try {
      po::variables_map vm;
      po::store(po::command_line_parser(argc, argv.data()).options(d).positional(positional).run(), vm);
    } catch (const po::error& e) {
      return options::error_text(e, argc, argv.data(), d, positional);
    }
    return std::string("(parsed)");
  };
  const po::positional_options_description none;
  EXPECT_EQ(text({"--lr", "-1", "--quiet", "word"}, none), "'word' is no option, nor the value of one");
  EXPECT_EQ(text({"--name=x", "--name", "y", "w2"}, none), "'w2' is no option, nor the value of one");
  EXPECT_EQ(text({"--lr", "2"}, none), "(parsed)");
  po::positional_options_description one;
  one.add("name", 1);
  EXPECT_EQ(text({"first", "--quiet", "second"}, one),
            "'second' is no option, nor the value of one (1 argument(s) at most besides the options)");
  const std::string unknown = text({"--bogus"}, none);
  EXPECT_NE(unknown.find("--bogus"), std::string::npos) << unknown;
  // An option given no value takes the next option as it (`--name --lr 2`: "2" is left over):
  // the error says so, not only that the word after it is stray.
  EXPECT_EQ(text({"--name", "--lr", "2"}, none),
            "'2' is no option, nor the value of one (--name took '--lr' as its value: give --name one)");
  EXPECT_EQ(text({"first", "--name", "--quiet", "second"}, one),
            "'second' is no option, nor the value of one (--name took '--quiet' as its value: give --name one; "
            "1 argument(s) at most besides the options)");
  EXPECT_EQ(text({"--name", "--lr", "--quiet", "2"}, none), "'2' is no option, nor the value of one");
}

}  // namespace
}  // namespace hpc::testing

namespace hpc::testing {
namespace {

namespace po = boost::program_options;

// The kit's parts for hpcrun's command line, on a struct of their own: each test parses a command
// line through a table and reads it back.
struct Launch {
  struct Inner {
    double factor = 1.5;
    double seconds = 120;
    bool drain = false;
  };
  int np = 0;  // 0: not given
  int restarts = 3;
  double start = 600;
  bool start_given = false;
  double start_minutes = 0;
  std::string agent = "ssh";
  bool agent_given = false;
  std::string hosts;
  std::vector<std::string> env;
  std::string pair = "1:2";
  int first = 0, second = 0;
  Inner inner;
};

std::vector<options::Entry<Launch>> launch_table() {
  using L = Launch;
  return {options::number({"np", 'n', "-np"}, &L::np, "ranks", options::from_to(1, 100), options::Default::None),
          options::number("restarts", &L::restarts, "restarts", options::at_least(0)),
          options::then(options::noting_given(options::duration("start", &L::start, "start",
                                                                options::more_than(0.0, "why"), options::Default::None),
                                              &L::start_given),
                        [](L& l) { l.start_minutes = l.start / 60; }),
          options::noting_given(options::text_with_default("agent", &L::agent, "agent", options::Presence::NotBlank),
                                &L::agent_given),
          options::path({"hosts", 'H'}, &L::hosts, "hosts", options::Presence::NotBlank),
          options::repeated({"env", 'x'}, &L::env, "env",
                            [](const std::string& w, const std::string& shown) {
                              HPC_REQUIRE(w != "bad", shown, " '", w, "' is bad");
                            }),
          options::then(options::text_with_default("pair", &L::pair, "a:b"),
                        [](L& l) {
                          l.first = std::stoi(l.pair.substr(0, l.pair.find(':')));
                          l.second = std::stoi(l.pair.substr(l.pair.find(':') + 1));
                        }),
          options::number_at<L>("factor", [](auto& l) -> auto& { return l.inner.factor; }, "factor",
                                options::more_than(1.0)),
          options::duration_at<L>("seconds", [](auto& l) -> auto& { return l.inner.seconds; }, "seconds"),
          options::flag_at<L>("drain", [](auto& l) -> auto& { return l.inner.drain; }, "drain")};
}

// Parses argv (after the program's name) into a fresh Launch; a usage error's message in *error.
Launch parse_launch(std::vector<std::string> args, std::string* error = nullptr, std::string* help = nullptr) {
  const auto table = launch_table();
  Launch l;
  po::options_description d;
  options::add(table, d, l);
  if (help) {
    std::ostringstream shown;
    shown << d;
    *help = shown.str();
  }
  for (std::string& a : args)
    for (const auto& e : table) a = options::long_form(e, a);
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(args).options(d).run(), vm);
    po::notify(vm);
    options::read(table, vm, l);
  } catch (const Error& e) {
    if (!error) throw;
    *error = e.what();
  }
  return l;
}

std::string launch_error(std::vector<std::string> args) {
  std::string error;
  parse_launch(std::move(args), &error);
  return error;
}

// Not given, each member keeps its initial value, --help shows the defaults that are shown and none
// of the others, and nothing is checked or noted as given.
TEST(OptionKit, DefaultsShownOrNotAndUnchecked) {
  std::string help;
  const Launch l = parse_launch({}, nullptr, &help);
  EXPECT_EQ(l.np, 0);
  EXPECT_EQ(l.restarts, 3);
  EXPECT_EQ(l.start, 600);
  EXPECT_FALSE(l.start_given);
  EXPECT_EQ(l.agent, "ssh");
  EXPECT_FALSE(l.agent_given) << "a default is not given";
  EXPECT_TRUE(l.env.empty());
  EXPECT_EQ(l.first, 1) << "then's step runs on the default too";
  EXPECT_EQ(l.second, 2);
  EXPECT_EQ(l.inner.factor, 1.5);
  EXPECT_EQ(l.inner.seconds, 120);
  EXPECT_FALSE(l.inner.drain);
  for (const char* shown : {"--restarts arg (=3)", "--agent arg (=ssh)", "--pair arg (=1:2)", "--factor arg (=1.5)",
                            "--seconds arg (=2m)", "-n [ --np ] arg ", "-H [ --hosts ] arg ", "-x [ --env ] arg "})
    EXPECT_NE(help.find(shown), std::string::npos) << shown << "\n" << help;
  for (const char* hidden : {"--np arg (=", "--start arg (=", "--hosts arg (="})
    EXPECT_EQ(help.find(hidden), std::string::npos) << hidden << "\n" << help;
}

// Given, each reaches its member: by its short name, by its single-dash spelling (-np 4, -np=4),
// repeated, nested, made into other members.
TEST(OptionKit, ShortNamesSpellingsRepeatsAndNestedMembers) {
  EXPECT_EQ(parse_launch({"-n", "4"}).np, 4);
  EXPECT_EQ(parse_launch({"-np", "5"}).np, 5);
  EXPECT_EQ(parse_launch({"-np=6"}).np, 6);
  EXPECT_EQ(parse_launch({"--np", "7"}).np, 7);
  EXPECT_EQ(parse_launch({"-H", "a,b"}).hosts, "a,b");
  const Launch l = parse_launch({"-x", "A", "--env", "B=1", "-x", "C", "--start", "1m", "--agent", "rsh", "--pair",
                                 "3:4", "--factor", "2", "--seconds", "30s", "--drain"});
  EXPECT_EQ(l.env, (std::vector<std::string>{"A", "B=1", "C"}));
  EXPECT_EQ(l.start, 60);
  EXPECT_TRUE(l.start_given);
  EXPECT_EQ(l.start_minutes, 1) << "then's step after the duration is read";
  EXPECT_EQ(l.agent, "rsh");
  EXPECT_TRUE(l.agent_given);
  EXPECT_EQ(l.first, 3);
  EXPECT_EQ(l.second, 4);
  EXPECT_EQ(l.inner.factor, 2);
  EXPECT_EQ(l.inner.seconds, 30);
  EXPECT_TRUE(l.inner.drain);
  EXPECT_TRUE(parse_launch({"--agent", "ssh"}).agent_given) << "given, even as the default";
  const auto table = launch_table();
  EXPECT_EQ(parse_launch({"-x", "A", "B"}).env, (std::vector<std::string>{"A"})) << "one word each time";
  EXPECT_EQ(options::long_form(table[0], "-npx"), "-npx") << "only the spelling itself, or with =";
  EXPECT_EQ(options::long_form(table[4], "-H"), "-H") << "a short name is Boost's own";
  Launch back;
  table[5].parse(table[5].value(l), back);
  EXPECT_EQ(back.env, l.env) << "a repeated option's text reads back";
}

// A value outside its range, or blank where it must not be, is one usage error naming the option as
// people write it (its spelling).
TEST(OptionKit, RangesAndBlanksAreUsageErrorsNamingTheOption) {
  EXPECT_EQ(launch_error({"-np", "0"}), "-np must be a whole number from 1 to 100, got 0");
  EXPECT_EQ(launch_error({"--np", "101"}), "-np must be a whole number from 1 to 100, got 101");
  EXPECT_EQ(launch_error({"--restarts", "-1"}), "--restarts must be 0 or more, got -1");
  EXPECT_EQ(launch_error({"--start", "0"}), "--start must be more than 0 (why), got 0");
  EXPECT_EQ(launch_error({"--factor", "1"}), "--factor must be more than 1, got 1");
  for (const char* not_finite : {"nan", "inf"})
    EXPECT_EQ(launch_error({"--factor", not_finite}).rfind("--factor must be more than 1, got ", 0), 0u) << not_finite;
  for (const char* blank : {"", " ", "\t"}) {
    EXPECT_EQ(launch_error({"-H", blank}), "-H is empty (an unset variable?): give a value or leave the option out");
    EXPECT_EQ(launch_error({"--agent", blank}).rfind("--agent is empty", 0), 0u);
  }
  EXPECT_EQ(launch_error({"-x", "A", "-x", "bad"}), "-x 'bad' is bad");
  for (const std::vector<std::string>& fine : {std::vector<std::string>{"-np", "1"}, {"-np", "100"}, {"--restarts", "0"},
                                              {"--start", "0.1s"}, {"--factor", "1.01"}, {"-H", "a"}})
    EXPECT_EQ(launch_error(fine), "") << fine[0] << " " << fine[1];
}

// Another rank's line names it and its host, as its errors do (it named neither: a warning in a
// 64-rank log could be anyone's), once even where the line begins by saying so; rank 0's lines
// are as they were. (Informational lines of other ranks, which clean-snapshots prints on each
// host's first rank, are not dropped.)
TEST(Log, AnotherRanksWarningNamesItsRankAndHost) {
  const log::Level level = log::level();
  log::set_stamps(log::Stamps::Off);
  const auto lines_of = [](int rank, const std::function<void()>& say) {
    log::set_process(rank, 2, "rank " + std::to_string(rank) + " on node7");
    ::testing::internal::CaptureStderr();
    ::testing::internal::CaptureStdout();
    say();
    const std::string out = ::testing::internal::GetCapturedStdout();
    return ::testing::internal::GetCapturedStderr() + out;
  };
  log::set_level(log::Level::Info);
  EXPECT_EQ(lines_of(1, [] { log::warn("the disk is slow"); }),
            "hpctrain: warning: rank 1 on node7: the disk is slow\n");
  EXPECT_EQ(lines_of(1, [] { log::warn("rank 1 on node7: no step finished for 5 s"); }),
            "hpctrain: warning: rank 1 on node7: no step finished for 5 s\n");
  EXPECT_EQ(lines_of(0, [] { log::warn("the disk is slow"); }), "hpctrain: warning: the disk is slow\n");
  EXPECT_EQ(lines_of(3, [] { log::info("removed the snapshots of run 1a"); }),
            "hpctrain: rank 3 on node7: removed the snapshots of run 1a\n");
  EXPECT_EQ(lines_of(0, [] { log::info("epoch 1"); }), "hpctrain: epoch 1\n");
  log::set_process(0, 1, "rank 0 on node7");
  log::set_level(level);
  log::set_stamps(log::Stamps::Auto);
}

// Libraries loaded at run time (nvJPEG, cuBLAS): a missing file and a missing symbol are each
// named with the loader's reason; a present symbol is the one the loader sees.
TEST(SharedLibrary, OpensResolvesAndNamesWhatIsMissing) {
  std::string why;
  EXPECT_EQ(SharedLibrary::open("libnot-here.so.7", &why), nullptr);
  EXPECT_NE(why.find("cannot load libnot-here.so.7 ("), std::string::npos) << why;
  EXPECT_NE(why.find("No such file"), std::string::npos) << why;

  std::unique_ptr<SharedLibrary> z = SharedLibrary::open("libz.so.1", &why);
  ASSERT_NE(z, nullptr) << why;
  EXPECT_EQ(z->name(), "libz.so.1");
  const char* (*version)() = nullptr;
  ASSERT_TRUE(z->resolve("zlibVersion", "zlib", &version, &why)) << why;
  EXPECT_EQ(std::string(version()).substr(0, 2), "1.");
  int (*absent)() = nullptr;
  EXPECT_FALSE(z->resolve("zlibNoSuchCall", "zlib", &absent, &why));
  EXPECT_EQ(absent, nullptr);
  EXPECT_NE(why.find("libz.so.1 has no zlibNoSuchCall ("), std::string::npos) << why;
  EXPECT_NE(why.find("): not zlib, or too old a one"), std::string::npos) << why;
}

}  // namespace
}  // namespace hpc::testing

// A handler's own failing call (here a write to a closed descriptor, EBADF) leaves the errno of
// the code it interrupted as it was.
TEST(SignalSafe, AHandlerThatKeepsErrnoLeavesTheInterruptedCodesErrno) {
  struct sigaction sa {}, old {};
  sa.sa_handler = [](int) {
    const hpc::signal_safe::KeepErrno keep;
    [[maybe_unused]] const ssize_t n = ::write(-1, "x", 1);
  };
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR2, &sa, &old), 0);
  errno = ENOENT;
  ASSERT_EQ(::raise(SIGUSR2), 0);
  const int after = errno;
  ::sigaction(SIGUSR2, &old, nullptr);
  EXPECT_EQ(after, ENOENT);
}
