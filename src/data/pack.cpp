#include "data/pack.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.hpp"
#include "core/file_identity.hpp"
#include "core/json.hpp"
#include "core/rng.hpp"
#include "data/image_file.hpp"
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

// Class folders in name order, their JPEGs in name order; anything else is counted, not packed.
std::vector<Source> scan(const std::string& src, PackResult& result) {
  std::error_code ec;
  HPC_REQUIRE(fs::is_directory(src, ec), "image folder ", src, " does not exist or is not a directory");
  std::vector<fs::path> class_dirs;
  for (const auto& e : fs::directory_iterator(src, ec)) {
    // A class folder behind a link that leads nowhere (a file system not mounted): left out, it
    // shifted every later class's label without a word.
    std::error_code link;
    HPC_REQUIRE(!e.is_symlink(link) || fs::exists(e.path(), link), e.path().string(), " is a link to ",
                fs::read_symlink(e.path(), link).string(), ", which does not exist: mount or mend it, or remove it");
    if (e.is_directory()) class_dirs.push_back(e.path());
    else ++result.ignored_files;
  }
  HPC_REQUIRE(!ec, "cannot list ", src, ": ", ec.message());
  HPC_REQUIRE(!class_dirs.empty(), "image folder ", src, " has no class folders (expected SRC/<class>/<image>.jpg)");
  std::sort(class_dirs.begin(), class_dirs.end());
  std::vector<Source> sources;
  for (const fs::path& dir : class_dirs) {
    const auto label = static_cast<uint32_t>(result.classes.size());
    result.classes.push_back(dir.filename().string());
    std::vector<std::string> files;
    // A JPEG's name on what is no regular file (a dangling link, a FIFO) is taken as an image and
    // refused when it is read, naming it (it was left out without a word, counted nowhere).
    // Folders inside a class count, linked ones too (as torchvision's ImageFolder follows them):
    // they were passed over, counted nowhere. (A loop of links is refused, naming it.)
    walk_files(dir.string(), [&](const fs::directory_entry& e) {
      std::error_code type;
      if (is_jpeg_name(e.path())) files.push_back(e.path().string());
      else if (e.is_regular_file(type)) ++result.ignored_files;
    });
    HPC_REQUIRE(!files.empty(), "class folder ", dir.string(), " has no JPEG images (*.jpg, *.jpeg)");
    std::sort(files.begin(), files.end());
    for (std::string& f : files) sources.push_back({std::move(f), label});
  }
  return sources;
}

// True when `inner` is `outer` or lies below it (both made absolute, links resolved).
bool is_within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return true;
}

// A small file written whole under PATH.part, flushed to storage and renamed: the manifest (the
// commit point) and classes.txt.
void write_file_synced(const std::string& path, const std::string& text) {
  const std::string part = path + ".part";
  const int fd = create_new_file(part);  // never through a link or into a file planted under the name
  HPC_REQUIRE(fd >= 0, "cannot create ", part, ": ", std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += static_cast<size_t>(w);
  }
  const int err = done < text.size() || ::fsync(fd) != 0 ? errno : 0;
  ::close(fd);
  if (err == 0 && ::rename(part.c_str(), path.c_str()) == 0) return;
  const int why = err ? err : errno;
  ::unlink(part.c_str());
  usage_error("cannot write ", path, ": ", std::strerror(why));
}

// OUT while a packing writes into it: created (with missing parents) if needed and removed again
// unless the packing commits, so a failed packing leaves no new directory; flock()ed so that two
// packings of one OUT cannot interleave (a lock on the directory itself: no lock file to leave
// behind; on NFS only within one client).
class OutDir {
 public:
  explicit OutDir(const std::string& path) : path_(path) {
    std::error_code ec;
    for (fs::path p = fs::absolute(path, ec); !p.empty() && !fs::exists(p, ec); p = p.parent_path())
      created_.insert(created_.begin(), p);
    make_directories(path, kSharedDirectoryMode, ec);  // never others' to write in, whatever the umask
    HPC_REQUIRE(!ec, "cannot create ", path, ": ", ec.message());
    try {
      require_safe_directory(path, "OUT");  // again, for one another user made since it was checked
    } catch (const Error&) {
      remove_created();
      throw;
    }
    fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    HPC_REQUIRE(fd_ >= 0, "cannot open ", path, ": ", std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)
      usage_error("another hpcdata pack is writing into ", path, ": wait until it ends");
  }
  ~OutDir() {
    ::close(fd_);
    if (!committed_) remove_created();
  }
  OutDir(const OutDir&) = delete;
  OutDir& operator=(const OutDir&) = delete;
  // Renames and new files in OUT reach storage before what depends on them.
  void sync() const { HPC_REQUIRE(::fsync(fd_) == 0, "cannot flush ", path_, ": ", std::strerror(errno)); }
  void commit() { committed_ = true; }

 private:
  void remove_created() const {
    std::error_code ec;
    for (auto p = created_.rbegin(); p != created_.rend(); ++p) fs::remove(*p, ec);  // only if empty
  }

  std::string path_;
  std::vector<fs::path> created_;  // outermost first
  int fd_ = -1;
  bool committed_ = false;
};

// The shards a packing writes, removed unless it commits (their .part files remove themselves).
struct NewShards {
  std::vector<std::string> paths;
  bool committed = false;
  ~NewShards() {
    if (committed) return;
    std::error_code ec;
    for (const std::string& p : paths) fs::remove(p, ec);
  }
};

// Generations are counted from 1, one a packing: far below this.
constexpr int64_t kMostGenerations = 1'000'000'000'000'000;

// One more than any generation of the split's shard files in OUT (those of a packing that was
// killed included), so new shards never take the name of a file there.
int64_t next_generation(const std::string& out, const std::string& split) {
  int64_t g = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const auto m = parse_shard_file_name(e.path().filename().string());
    if (m && m->split == split && !m->generation.empty()) {
      int64_t k = 0;
      const std::string& digits = m->generation;
      const auto [end, parsed] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
      HPC_REQUIRE(parsed == std::errc() && end == digits.data() + digits.size() && k < kMostGenerations, "shard file ",
                  e.path().string(), " has a generation past any hpcdata writes (", kMostGenerations,
                  "): move it out of ", out);
      g = std::max(g, k);
    }
  }
  return g + 1;
}

// The classes a split in OUT was packed with; nullopt when it has none (or they cannot be read:
// a split broken beyond reading constrains nothing, and packing it again repairs it).
std::optional<std::vector<std::string>> committed_classes(const std::string& out, const std::string& split) {
  try {
    if (const std::optional<SplitManifest> m = read_split_manifest(out, split)) return m->classes;
    if (!list_shards(out, split).empty()) return read_class_names(out);
  } catch (const Error&) {
  }
  return std::nullopt;
}

// The other splits' classes, which this packing must share ("<split>.json" and legacy shards).
std::map<std::string, std::vector<std::string>> other_splits(const std::string& out, const std::string& split) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".json")) names.insert(name.substr(0, name.size() - 5));
    else if (const auto m = parse_shard_file_name(name); m && m->generation.empty() && !m->part) names.insert(m->split);
  }
  names.erase(split);
  std::map<std::string, std::vector<std::string>> found;
  for (const std::string& n : names)
    if (auto classes = committed_classes(out, n)) found[n] = std::move(*classes);
  return found;
}

void check_classes_agree(const PackOptions& o, const std::map<std::string, std::vector<std::string>>& others,
                         const std::vector<std::string>& classes) {
  for (const auto& [other, theirs] : others)
    HPC_REQUIRE(theirs == classes, "the ", other, " split in ", o.out, " has ", theirs.size(),
                " classes that differ from the ", classes.size(), " class folders in ", o.src,
                ": pack the splits of one dataset from folders with the same classes");
}

// The split's manifest (shards.hpp, read_split_manifest): what was packed and each shard file.
std::string manifest_json(const PackOptions& o, const PackResult& r, const std::vector<SplitManifest::Shard>& shards,
                          int64_t generation) {
  JsonObject files = JsonObject::array();
  for (const SplitManifest::Shard& s : shards)
    files.push_back({{"name", s.name}, {"bytes", s.bytes}, {"records", s.records}, {"index_crc32", s.index_crc}});
  const JsonObject m{{"format", "hpcdata shards"},
                     {"version", kManifestVersion},
                     {"generation", generation},
                     {"split", o.split},
                     // Links resolved and no trailing "/": "src/" and "src" are one folder (hpctrain
                     // warns of a val split packed from train's).
                     {"source", fs::weakly_canonical(fs::absolute(o.src)).string()},
                     {"classes", r.classes.size()},
                     {"images", r.images},
                     {"shards", r.shards},
                     {"bytes", r.bytes},
                     {"resize", o.resize},
                     {"quality", o.resize || r.cmyk_converted ? o.quality : 0},
                     {"cmyk_converted", r.cmyk_converted},
                     {"seed", o.seed},
                     {"skipped", r.skipped},
                     {"class_names", r.classes},
                     {"shard_files", files}};
  return json_text(m, 2) + "\n";
}

void check_stop(const PackOptions& o) {
  if (o.stop && o.stop->load()) usage_error("interrupted before the new shards were complete");
}

// What a shard holds of the image file `path` read as `file`: the file itself, or the image
// encoded anew where it is shrunk (--resize) or CMYK (`cmyk` set: packed as RGB, which nvJPEG
// decodes as it does the others). Every image is decoded: none is packed unreadable.
std::vector<uint8_t> packed_image(const PackOptions& o, const std::string& path, std::vector<uint8_t> file,
                                  bool& cmyk) {
  Image img = decode_jpeg(file, path, &cmyk);
  const bool shrink = o.resize && std::min(img.height, img.width) > o.resize;
  if (shrink || cmyk) return encode_jpeg(shrink ? resize_shorter_side(img, o.resize) : img, o.quality);
  return file;
}

// Decodes every image (resizing where asked) into shards named `names`, one thread per shard.
void write_shards(const PackOptions& o, const std::vector<Source>& sources, const std::vector<std::string>& names,
                  PackResult& result) {
  const auto total = static_cast<int64_t>(sources.size());
  const auto shards = static_cast<int64_t>(names.size());
  std::atomic<int64_t> next_shard{0}, done{0}, bytes{0}, packed{0}, converted{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;
  auto work = [&] {
    try {
      for (int64_t s; !failed && (s = next_shard++) < shards;) {
        ShardWriter writer(names[static_cast<size_t>(s)]);
        const int64_t begin = s * o.images_per_shard, end = std::min(total, begin + o.images_per_shard);
        for (int64_t i = begin; i < end && !failed; ++i, ++done) {
          check_stop(o);
          const Source& src = sources[static_cast<size_t>(i)];
          std::vector<uint8_t> bytes_in = read_whole_file(src.path);
          try {
            bool cmyk = false;
            bytes_in = packed_image(o, src.path, std::move(bytes_in), cmyk);
            if (cmyk) ++converted;
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
  const int64_t wanted = std::clamp<int64_t>(o.threads, 1, std::max<int64_t>(shards, 1));  // one shard each at most
  for (int64_t t = 0; t < wanted; ++t) threads.emplace_back(work);
  while (o.progress && done < total && !failed) {
    o.progress(done, total);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  if (o.progress) o.progress(total, total);
  std::sort(result.skipped.begin(), result.skipped.end());
  HPC_REQUIRE(packed > 0, "none of the ", total, " images in ", o.src, " decoded (all skipped by --skip-corrupt",
              result.skipped.empty() ? std::string() : ", the first: " + result.skipped.front(), ")");
  result.images = packed;
  result.cmyk_converted = converted;
  result.shards = shards;
  result.bytes = bytes;
}

// Reads every new shard back as hpctrain will (footer, index, CRC, labels) before anything
// depends on it: the manifest's entries.
std::vector<SplitManifest::Shard> verify_shards(const std::vector<std::string>& paths, const PackResult& r) {
  std::vector<SplitManifest::Shard> entries;
  int64_t images = 0;
  for (const std::string& p : paths) {
    const ShardReader reader(p, static_cast<uint32_t>(r.classes.size()));
    entries.push_back({fs::path(p).filename().string(), reader.file_bytes(), reader.count(), reader.index_crc()});
    images += reader.count();
  }
  HPC_CHECK(images == r.images, "the new shards hold ", images, " images where ", r.images, " were packed");
  return entries;
}

// After the commit: classes.txt follows the dataset's classes, and the split's files that the
// new manifest does not list (the replaced set, a killed packing's leftovers) go. Nothing here
// can undo the commit; a failure is a warning.
void tidy_after_commit(const PackOptions& o, const std::vector<std::string>& kept, bool classes_changed,
                       PackResult& result) {
  const fs::path classes = fs::path(o.out) / "classes.txt";
  std::error_code ec;
  if (classes_changed || !fs::exists(classes, ec)) {
    std::string text;
    for (const std::string& c : result.classes) text += c + "\n";
    try {
      write_file_synced(classes.string(), text);
    } catch (const Error& e) {
      result.warnings.push_back(e.what());
    }
  }
  for (const auto& e : fs::directory_iterator(o.out, ec)) {
    const auto m = parse_shard_file_name(e.path().filename().string());
    if (!m || m->split != o.split) continue;
    if (std::find(kept.begin(), kept.end(), e.path().string()) != kept.end()) continue;
    std::error_code rm;
    if (!fs::remove(e.path(), rm) && rm)
      result.warnings.push_back("cannot remove the replaced shard " + e.path().string() + ": " + rm.message());
  }
}

}  // namespace

void check_pack_paths(const PackOptions& o) {
  // hpctrain's shards dataset reads these two (dataset.cpp): any other split would be written for nobody.
  HPC_REQUIRE(o.split == "train" || o.split == "val", "--split ", o.split, " is not a split hpctrain reads (it trains "
              "on train and evaluates on val): choose --split train or --split val");
  HPC_REQUIRE(!o.src.empty() && !o.out.empty(), "an image folder SRC and an output directory OUT are needed");
  require_not_root_dir(o.out, "OUT");
  std::error_code ec;
  HPC_REQUIRE(fs::is_directory(o.src, ec), "image folder ", o.src, " does not exist or is not a directory");
  // A file there, or a path that can never be a directory (a file above it, a link loop, a name
  // past NAME_MAX), is the user's to fix: refused before anything is read, not a failure of the
  // storage after the images were scanned. Only "not there yet" is for OutDir to create.
  struct stat st {};
  if (::stat(o.out.c_str(), &st) == 0)
    HPC_REQUIRE(S_ISDIR(st.st_mode), "output directory ", o.out, " exists and is not a directory");
  else if (errno != ENOENT)
    usage_error("output directory ", o.out, " cannot be made or used: ", std::strerror(errno));
  // One that other users may write to (another user's 777, made first in /tmp), or that lies, there
  // or to be made, in a folder they may write to that is not sticky, is refused as hpctrain's
  // checkpoint directory is: they could swap the shards once packed, or rename OUT away and put
  // their own in its place. (One made here is never others' to write: OutDir.)
  require_safe_directory(o.out, "OUT");
  // One hpcdata prepare made holds another dataset (its hpcdata.json names it): hpctrain took the
  // folder for that one, and the shards packed beside it no longer trained.
  std::error_code prepared;
  HPC_REQUIRE(!fs::exists(fs::path(o.out) / "hpcdata.json", prepared), "output directory ", o.out,
              " holds a dataset hpcdata prepare made (its hpcdata.json): pack into another directory");
  std::error_code src_ec, out_ec;  // links resolved, so that another spelling of SRC is still SRC
  const fs::path src = fs::weakly_canonical(fs::absolute(o.src), src_ec);
  const fs::path out = fs::weakly_canonical(fs::absolute(o.out), out_ec);
  HPC_REQUIRE(!same_file(o.src, o.out), "the output directory ", o.out,
              " is the image folder itself: choose another OUT");
  if (src_ec || out_ec) return;  // a path that cannot be resolved fails below, naming it
  HPC_REQUIRE(!is_within(out, src), "the output directory ", o.out, " is inside the image folder ", o.src,
              " (it would be read as a class): choose an OUT outside SRC");
}

PackResult pack_image_folder(const PackOptions& o) {
  HPC_REQUIRE(o.images_per_shard > 0, "images per shard must be positive");
  HPC_REQUIRE(o.resize >= 0, "resize must be 0 or a positive number of pixels");
  HPC_REQUIRE(o.quality >= 1 && o.quality <= 100, "JPEG quality must be 1..100");
  check_pack_paths(o);
  PackResult result;
  std::vector<Source> sources = scan(o.src, result);
  for (const std::string& c : result.classes) {
    HPC_REQUIRE(c.find_first_of("\r\n") == std::string::npos, "class folder name '", c, "' holds a line break");
    // The manifest (JSON) would hold it with U+FFFD for those bytes, classes.txt as it is: the
    // two would never agree again.
    // (Named by its bytes, \xNN for those that are not UTF-8: U+FFFD in their place named no folder.)
    HPC_REQUIRE(is_utf8(c), "class folder name '", one_line_unambiguous(c), "' is not UTF-8 text: rename the folder");
  }
  // One fixed shuffle (Fisher-Yates on Philox: the same on every platform), so shards mix classes.
  Philox rng(o.seed, RngStream::Pack);
  for (size_t i = sources.size(); i > 1; --i) std::swap(sources[i - 1], sources[rng.below(static_cast<uint32_t>(i))]);

  // The checkpoint way: the new set beside the old one under new names, verified, then the
  // manifest replaced in one rename; until then OUT is exactly as it was.
  OutDir out(o.out);
  const std::map<std::string, std::vector<std::string>> others = other_splits(o.out, o.split);
  check_classes_agree(o, others, result.classes);
  std::optional<std::vector<std::string>> before = committed_classes(o.out, o.split);  // the dataset's classes
  if (!before && !others.empty()) before = others.begin()->second;
  const int64_t generation = next_generation(o.out, o.split);
  const int64_t shards = (static_cast<int64_t>(sources.size()) + o.images_per_shard - 1) / o.images_per_shard;
  NewShards fresh;
  for (int64_t s = 0; s < shards; ++s) {
    fresh.paths.push_back((fs::path(o.out) / shard_name(o.split, s, shards, generation)).string());
    // Never over a file there (a committed shard would go with a failed packing's).
    std::error_code ec;
    HPC_CHECK(!fs::exists(fs::symlink_status(fresh.paths.back(), ec)), "the new shard ", fresh.paths.back(),
              " would replace a file there");
  }
  write_shards(o, sources, fresh.paths, result);
  const std::vector<SplitManifest::Shard> entries = verify_shards(fresh.paths, result);
  check_stop(o);
  out.sync();  // the shards' names are on storage before the manifest that lists them
  write_file_synced((fs::path(o.out) / (o.split + ".json")).string(), manifest_json(o, result, entries, generation));
  fresh.committed = true;
  out.commit();
  out.sync();
  tidy_after_commit(o, fresh.paths, !before || *before != result.classes, result);
  return result;
}

}  // namespace hpc::data
