#include "data/pack.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "data/jpeg.hpp"
#include "data/shards.hpp"

namespace hpc::data {
namespace fs = std::filesystem;
namespace {

struct Source {
  std::string path;
  uint32_t label;
};

bool is_jpeg_name(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg";
}

std::vector<uint8_t> read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HPC_REQUIRE(in, "cannot read ", path);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  HPC_REQUIRE(!in.bad(), "cannot read ", path);
  return bytes;
}

// Class folders in name order, their JPEGs in name order; anything else is counted, not packed.
std::vector<Source> scan(const std::string& src, PackResult& result) {
  std::error_code ec;
  HPC_REQUIRE(fs::is_directory(src, ec), "image folder ", src, " does not exist or is not a directory");
  std::vector<fs::path> class_dirs;
  for (const auto& e : fs::directory_iterator(src, ec))
    if (e.is_directory()) class_dirs.push_back(e.path());
    else ++result.ignored_files;
  HPC_REQUIRE(!ec, "cannot list ", src, ": ", ec.message());
  HPC_REQUIRE(!class_dirs.empty(), "image folder ", src, " has no class folders (expected SRC/<class>/<image>.jpg)");
  std::sort(class_dirs.begin(), class_dirs.end());
  std::vector<Source> sources;
  for (const fs::path& dir : class_dirs) {
    const auto label = static_cast<uint32_t>(result.classes.size());
    result.classes.push_back(dir.filename().string());
    std::vector<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(dir, ec))
      if (e.is_regular_file() && is_jpeg_name(e.path())) files.push_back(e.path().string());
      else if (e.is_regular_file()) ++result.ignored_files;
    HPC_REQUIRE(!ec, "cannot list ", dir.string(), ": ", ec.message());
    HPC_REQUIRE(!files.empty(), "class folder ", dir.string(), " has no JPEG images (*.jpg, *.jpeg)");
    std::sort(files.begin(), files.end());
    for (std::string& f : files) sources.push_back({std::move(f), label});
  }
  return sources;
}

// classes.txt is shared by the splits: the first packing writes it, later ones must agree.
void write_or_check_classes(const std::string& out, const std::vector<std::string>& classes) {
  const fs::path path = fs::path(out) / "classes.txt";
  std::error_code ec;
  if (fs::exists(path, ec)) {
    const std::vector<std::string> existing = read_class_names(out);
    HPC_REQUIRE(existing == classes, path.string(), " lists ", existing.size(), " classes that differ from the ",
                classes.size(), " class folders here: pack the splits of one dataset from folders with the same classes");
    return;
  }
  const std::string part = path.string() + ".part";
  {
    std::ofstream f(part);
    for (const std::string& c : classes) {
      HPC_REQUIRE(c.find('\n') == std::string::npos, "class folder name '", c, "' holds a newline");
      f << c << '\n';
    }
    HPC_REQUIRE(f.flush(), "cannot write ", part);
  }
  fs::rename(part, path);
}

void remove_split_shards(const std::string& out, const std::string& split) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(split + "-", 0) == 0 && (name.ends_with(".hpcs") || name.ends_with(".hpcs.part")))
      fs::remove(e.path(), ec);
  }
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += static_cast<char>(c);
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else o += static_cast<char>(c);
  }
  return o + "\"";
}

void write_manifest(const PackOptions& o, const PackResult& r) {
  const fs::path path = fs::path(o.out) / (o.split + ".json");
  const std::string part = path.string() + ".part";
  {
    std::ofstream f(part);
    f << "{\n  \"format\": \"hpcdata shards\", \"version\": 1,\n  \"split\": " << json_string(o.split)
      << ",\n  \"source\": " << json_string(fs::absolute(o.src).string()) << ",\n  \"classes\": " << r.classes.size()
      << ", \"images\": " << r.images << ", \"shards\": " << r.shards << ", \"bytes\": " << r.bytes
      << ",\n  \"resize\": " << o.resize << ", \"quality\": " << (o.resize ? o.quality : 0) << ", \"seed\": " << o.seed
      << ",\n  \"skipped\": [";
    for (size_t i = 0; i < r.skipped.size(); ++i) f << (i ? ", " : "") << json_string(r.skipped[i]);
    f << "]\n}\n";
    HPC_REQUIRE(f.flush(), "cannot write ", part);
  }
  fs::rename(part, path);
}

}  // namespace

PackResult pack_image_folder(const PackOptions& o) {
  HPC_REQUIRE(o.images_per_shard > 0, "images per shard must be positive");
  HPC_REQUIRE(o.resize >= 0, "resize must be 0 or a positive number of pixels");
  HPC_REQUIRE(o.quality >= 1 && o.quality <= 100, "JPEG quality must be 1..100");
  HPC_REQUIRE(!o.split.empty() && o.split.find_first_of("/-. ") == std::string::npos, "split name '", o.split,
              "' must be a plain word (train, val)");
  PackResult result;
  std::vector<Source> sources = scan(o.src, result);
  // One fixed shuffle (Fisher-Yates on Philox: the same on every platform), so shards mix classes.
  Philox rng(o.seed, RngStream::Pack);
  for (size_t i = sources.size(); i > 1; --i) std::swap(sources[i - 1], sources[rng.below(static_cast<uint32_t>(i))]);

  std::error_code ec;
  fs::create_directories(o.out, ec);
  HPC_REQUIRE(fs::is_directory(o.out, ec), "cannot create ", o.out);
  write_or_check_classes(o.out, result.classes);
  remove_split_shards(o.out, o.split);

  const auto total = static_cast<int64_t>(sources.size());
  const int64_t shards = (total + o.images_per_shard - 1) / o.images_per_shard;
  std::atomic<int64_t> next_shard{0}, done{0}, bytes{0}, packed{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;
  auto work = [&] {
    try {
      for (int64_t s; !failed && (s = next_shard++) < shards;) {
        ShardWriter writer((fs::path(o.out) / shard_name(o.split, s, shards)).string());
        const int64_t begin = s * o.images_per_shard, end = std::min(total, begin + o.images_per_shard);
        for (int64_t i = begin; i < end && !failed; ++i, ++done) {
          const Source& src = sources[static_cast<size_t>(i)];
          std::vector<uint8_t> bytes_in = read_whole(src.path);
          try {
            Image img = decode_jpeg(bytes_in, src.path);  // every image is decoded: none is packed unreadable
            if (o.resize && std::min(img.height, img.width) > o.resize)
              bytes_in = encode_jpeg(resize_shorter_side(img, o.resize), o.quality);
          } catch (const Error& e) {
            if (!o.skip_corrupt) throw;
            std::lock_guard lock(mu);
            result.skipped.push_back(src.path);
            continue;
          }
          writer.add(bytes_in, src.label);
          bytes += static_cast<int64_t>(bytes_in.size());
          ++packed;
        }
        if (!failed) writer.finish();
      }
    } catch (...) {
      std::lock_guard lock(mu);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < std::max(1, o.threads); ++t) threads.emplace_back(work);
  while (o.progress && done < total && !failed) {
    o.progress(done, total);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (std::thread& t : threads) t.join();
  if (error) {
    remove_split_shards(o.out, o.split);  // no half-packed split left to train on
    std::rethrow_exception(error);
  }
  if (o.progress) o.progress(total, total);
  std::sort(result.skipped.begin(), result.skipped.end());
  result.images = packed;
  result.shards = shards;
  result.bytes = bytes;
  write_manifest(o, result);
  return result;
}

}  // namespace hpc::data
