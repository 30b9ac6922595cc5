// src/io: safetensors reader, writer and element conversions. Malformed files are written by
// hand; every one must be refused at open with bad_file, naming the file (and the tensor key).
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "catch.hpp"
#include "src/io/safetensors.hpp"
#include "src/io/safetensors_writer.hpp"
#include "tilemoe/error.hpp"

namespace fs = std::filesystem;
using namespace tilemoe;
using namespace tilemoe::io;
using Shape = std::vector<std::int64_t>;

namespace {

struct TempDir {
  fs::path dir;
  TempDir() {
    char tmpl[] = "/tmp/tilemoe_io_test_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string file(const std::string& name) const { return (dir / name).string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

void write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string u64le(std::uint64_t n) { return std::string(reinterpret_cast<const char*>(&n), 8); }

// A file as bytes: header length (the header's own unless `n` lies), header text, data.
std::string st_bytes(std::string_view header, std::string_view data = {},
                     std::optional<std::uint64_t> n = {}) {
  return u64le(n.value_or(header.size())) + std::string(header) + std::string(data);
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":" + dtype + ",\"shape\":" + shape + ",\"data_offsets\":" + offsets +
         "}";
}

// A header object from its entries, e.g. obj({entry(...), entry(...)}).
std::string obj(std::initializer_list<std::string> entries) {
  std::string s = "{";
  for (const auto& e : entries) {
    if (s.size() > 1) s += ',';
    s += e;
  }
  s += '}';
  return s;
}

template <class F>
std::string error_of(F&& f, ErrorKind kind) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.kind() == kind);
    return e.what();
  }
  FAIL("no tilemoe::Error thrown");
  return {};
}

void expect_bad_path(const std::string& path, std::initializer_list<std::string_view> needles = {}) {
  std::string msg = error_of([&] { SafetensorsFile::open(path); }, ErrorKind::bad_file);
  INFO(msg);
  CHECK(msg.rfind(path + ": ", 0) == 0);
  for (auto n : needles) CHECK(msg.find(n) != std::string::npos);
}

void expect_bad(const TempDir& t, std::string_view bytes,
                std::initializer_list<std::string_view> needles = {}) {
  static int counter = 0;
  std::string path = t.file("case" + std::to_string(counter++) + ".safetensors");
  write_bytes(path, bytes);
  INFO("bytes: " << std::string(bytes.substr(0, 120)));
  expect_bad_path(path, needles);
}

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

std::string tensor_bytes(const SafetensorsFile& f, const TensorInfo& t) {
  return std::string(reinterpret_cast<const char*>(f.data(t)), t.nbytes);
}

std::uint64_t header_len(const std::string& bytes) {
  std::uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  return n;
}

constexpr std::array kAllDtypes{Dtype::BF16, Dtype::F16, Dtype::F32, Dtype::F8_E4M3,
                                Dtype::I8,   Dtype::U8,  Dtype::I32, Dtype::I64};

}  // namespace

TEST_CASE("dtype names, sizes and parsing", "[safetensors]") {
  for (Dtype d : kAllDtypes) CHECK(parse_dtype(dtype_name(d)) == d);
  CHECK(dtype_size(Dtype::BF16) == 2);
  CHECK(dtype_size(Dtype::F8_E4M3) == 1);
  CHECK(dtype_size(Dtype::I64) == 8);
  CHECK(std::string(dtype_name(Dtype::F8_E4M3)) == "F8_E4M3");
  CHECK_FALSE(parse_dtype("bf16"));
  CHECK_FALSE(parse_dtype("F64"));
  CHECK_FALSE(parse_dtype(""));
  CHECK(shape_string(Shape{}) == "[]");
  CHECK(shape_string(Shape{2, 3}) == "[2, 3]");
}

TEST_CASE("round trip of every dtype, metadata and streamed tensors", "[safetensors]") {
  TempDir tmp;
  std::mt19937 rng(7);
  std::map<std::string, std::string> expected;  // name -> bytes
  std::vector<std::string> buffers;
  buffers.reserve(kAllDtypes.size());  // add() keeps pointers into them
  SafetensorsWriter w;
  for (Dtype d : kAllDtypes) {
    std::string name = std::string("t_") + dtype_name(d);
    std::string bytes(15 * dtype_size(d), '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    buffers.push_back(bytes);
    w.add(name, d, {3, 5}, buffers.back().data());
    expected[name] = bytes;
  }
  w.add_f32("owned", {2, 2}, {1.f, -2.f, 3.5f, 0.f});
  w.add_f32("scalar", {}, {42.f});
  w.add("empty", Dtype::BF16, {0, 4}, nullptr);
  w.add_streamed("streamed", Dtype::I32, {7}, [](std::byte* dst, std::size_t n) {
    CHECK(reinterpret_cast<std::uintptr_t>(dst) % 4 == 0);
    REQUIRE(n == 28);
    for (std::int32_t i = 0; i < 7; ++i) std::memcpy(dst + 4 * i, &i, 4);
  });
  w.set_metadata("format", "pt");
  w.set_metadata("note", "quote \" backslash \\ newline \n unicode \xc3\xbc");
  std::string path = tmp.file("all.safetensors");
  w.write(path);
  CHECK(tmp.listing() == std::vector<std::string>{"all.safetensors"});

  SafetensorsFile f = SafetensorsFile::open(path);
  CHECK(f.path() == path);
  CHECK(f.metadata() == std::map<std::string, std::string>{
                            {"format", "pt"}, {"note", "quote \" backslash \\ newline \n unicode \xc3\xbc"}});
  REQUIRE(f.tensors().size() == 12);
  CHECK(std::is_sorted(f.tensors().begin(), f.tensors().end(),
                       [](auto& a, auto& b) { return a.name < b.name; }));
  for (const auto& [name, bytes] : expected) {
    const TensorInfo& t = f.get(name);
    CHECK(t.shape == Shape{3, 5});
    CHECK(t.numel() == 15);
    CHECK(tensor_bytes(f, t) == bytes);
  }
  CHECK(read_as_f32(f, "owned", Shape{2, 2}) == std::vector<float>{1.f, -2.f, 3.5f, 0.f});
  CHECK(read_as_f32(f, "scalar") == std::vector<float>{42.f});
  CHECK(f.get("scalar").shape.empty());
  CHECK(f.get("empty").numel() == 0);
  CHECK(read_as_bf16(f, "empty").empty());
  CHECK(read_as_i64(f, "streamed") == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6});

  // What the Python library insists on: 8-byte header, data without gaps up to the end of the
  // file; and what it guarantees: every tensor aligned to its element size.
  std::string bytes = read_bytes(path);
  std::uint64_t n = header_len(bytes);
  CHECK(n % 8 == 0);
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : f.tensors()) by_offset.push_back(&t);
  std::stable_sort(by_offset.begin(), by_offset.end(), [](auto a, auto b) { return a->offset < b->offset; });
  std::size_t pos = 8 + n;
  for (const TensorInfo* t : by_offset) {
    CHECK(t->offset == pos);
    CHECK(t->offset % dtype_size(t->dtype) == 0);
    pos += t->nbytes;
  }
  CHECK(pos == bytes.size());

  SafetensorsFile moved = std::move(f);
  CHECK(moved.find("owned") != nullptr);
  CHECK(moved.find("nope") == nullptr);
}

TEST_CASE("writer output is byte for byte what the Python library writes", "[safetensors]") {
  TempDir tmp;
  std::string path = tmp.file("x.safetensors");
  SafetensorsWriter w;
  w.add_f32("attn.0", {1, 2, 3}, {0, 1, 2, 3, 4, 5});
  w.write(path);
  std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  std::vector<float> vals{0, 1, 2, 3, 4, 5};
  CHECK(read_bytes(path) == st_bytes(header, {reinterpret_cast<const char*>(vals.data()), 24}));

  SafetensorsWriter empty;
  empty.write(path);
  CHECK(read_bytes(path) == st_bytes("{}      "));
  empty.set_metadata("framework", "pt");
  empty.write(path);
  CHECK(read_bytes(path) == st_bytes(R"({"__metadata__":{"framework":"pt"}}     )"));
}

TEST_CASE("conversions keep NaN, infinities, signed zeros and subnormals", "[safetensors]") {
  // `raw` holds the element in its low bytes (little-endian, as in a file).
  auto f32_of = [](Dtype d, std::uint64_t raw) {
    float out;
    convert_to_f32(d, reinterpret_cast<const std::byte*>(&raw), 1, &out);
    return out;
  };
  auto bf16_of = [](Dtype d, std::uint64_t raw) {
    bf16 out;
    convert_to_bf16(d, reinterpret_cast<const std::byte*>(&raw), 1, &out);
    return out;
  };
  // clang-format off
  constexpr std::uint32_t kNaN = 0xffffffff;  // any NaN
  struct ToF32 { Dtype d; std::uint64_t raw; std::uint32_t bits; };
  for (const ToF32& c : std::initializer_list<ToF32>{
      {Dtype::BF16, 0x7fc0, kNaN}, {Dtype::BF16, 0xff80, 0xff800000}, {Dtype::BF16, 0x8000, 0x80000000},
      {Dtype::BF16, 0x0001, 0x00010000},                       // bf16 subnormal
      {Dtype::F16, 0x0001, bits_of(std::ldexp(1.f, -24))},     // smallest subnormal
      {Dtype::F16, 0x03ff, bits_of(std::ldexp(1023.f, -24))},  // largest subnormal
      {Dtype::F16, 0x8001, bits_of(-std::ldexp(1.f, -24))}, {Dtype::F16, 0x0400, bits_of(std::ldexp(1.f, -14))},
      {Dtype::F16, 0x7bff, bits_of(65504.f)}, {Dtype::F16, 0x7c00, 0x7f800000}, {Dtype::F16, 0xfc00, 0xff800000},
      {Dtype::F16, 0x7e00, kNaN}, {Dtype::F16, 0x7c01, kNaN}, {Dtype::F16, 0x8000, 0x80000000},
      // f8 e4m3 "fn": no infinities; 0x7f and 0xff are NaN
      {Dtype::F8_E4M3, 0x01, bits_of(std::ldexp(1.f, -9))}, {Dtype::F8_E4M3, 0x07, bits_of(std::ldexp(7.f, -9))},
      {Dtype::F8_E4M3, 0x08, bits_of(std::ldexp(1.f, -6))}, {Dtype::F8_E4M3, 0x38, bits_of(1.f)},
      {Dtype::F8_E4M3, 0x7e, bits_of(448.f)}, {Dtype::F8_E4M3, 0xfe, bits_of(-448.f)},
      {Dtype::F8_E4M3, 0x80, 0x80000000}, {Dtype::F8_E4M3, 0x7f, kNaN}, {Dtype::F8_E4M3, 0xff, kNaN},
      {Dtype::I8, 0x80, bits_of(-128.f)}, {Dtype::U8, 0xff, bits_of(255.f)},
      {Dtype::I32, 0x80000000, bits_of(-2147483648.f)},
      {Dtype::I64, (1ull << 53) + 1, bits_of(static_cast<float>((1ll << 53) + 1))}}) {
    INFO(dtype_name(c.d) << " 0x" << std::hex << c.raw);
    float f = f32_of(c.d, c.raw);
    CHECK((c.bits == kNaN ? std::isnan(f) : bits_of(f) == c.bits));
  }
  // To bf16: round to nearest even, NaN stays NaN (even a signalling one with a low payload).
  struct ToBf16 { Dtype d; std::uint64_t raw; bf16 expected; };
  for (const ToBf16& c : std::initializer_list<ToBf16>{
      {Dtype::F32, 0x3f808000, 0x3f80},  // tie, even below
      {Dtype::F32, 0x3f818000, 0x3f82},  // tie, even above
      {Dtype::F32, 0x3f808001, 0x3f81}, {Dtype::F32, 0x7f7fffff, 0x7f80},  // max float rounds to inf
      {Dtype::F32, 0x7f800001, 0x7fc0}, {Dtype::F32, 0xff800000, 0xff80}, {Dtype::F32, 0x80000000, 0x8000},
      {Dtype::F32, 0x00018000, 0x0002}, {Dtype::F32, 0x00008000, 0x0000},  // subnormal ties
      {Dtype::F16, 0x3c04, 0x3f80},  // 1 + 2^-8: tie, even below
      {Dtype::F16, 0x3c0c, 0x3f82},  // 1 + 3*2^-8: tie, even above
      {Dtype::F16, 0x3c05, 0x3f81}, {Dtype::F16, 0x0001, 0x3380},  // f16 subnormal is a bf16 normal
      {Dtype::F16, 0xfc00, 0xff80}, {Dtype::F16, 0x8000, 0x8000}, {Dtype::F16, 0x7c01, 0x7fc0},
      {Dtype::BF16, 0x7f81, 0x7f81}}) {  // copied as is, payload and all
    INFO(dtype_name(c.d) << " 0x" << std::hex << c.raw);
    CHECK(bf16_of(c.d, c.raw) == c.expected);
  }
  // clang-format on
  // Every f8 value is exact in bf16.
  for (std::uint64_t v = 0; v < 256; ++v) {
    float f = f32_of(Dtype::F8_E4M3, v);
    bf16 b = bf16_of(Dtype::F8_E4M3, v);
    INFO("f8 byte " << v);
    CHECK((std::isnan(f) ? std::isnan(bf16_to_float(b)) : bits_of(bf16_to_float(b)) == bits_of(f)));
  }
  // Data at an odd address, as a file may place it.
  alignas(8) std::array<std::byte, 17> buf{};
  std::int64_t big = -5;
  std::memcpy(buf.data() + 1, &big, 8);
  float out = 0;
  convert_to_f32(Dtype::I64, buf.data() + 1, 1, &out);
  CHECK(out == -5.f);
  float one = 1.f;
  std::memcpy(buf.data() + 3, &one, 4);
  bf16 ob = 0;
  convert_to_bf16(Dtype::F32, buf.data() + 3, 1, &ob);
  CHECK(ob == 0x3f80);
  error_of([&] { convert_to_bf16(Dtype::I64, buf.data(), 1, &ob); }, ErrorKind::invalid_argument);
}

TEST_CASE("typed reads check shape and dtype", "[safetensors]") {
  TempDir tmp;
  std::string path = tmp.file("typed.safetensors");
  std::vector<bf16> b{0x3f80, 0xc000, 0x7f80};
  std::vector<std::int32_t> i32{-1, 7};
  std::vector<std::uint8_t> u8{0, 200};
  std::vector<std::int64_t> i64{1ll << 40, -3};
  SafetensorsWriter w;
  w.add_f32("f32", {2, 3}, {1, 2, 3, 4, 5, 6.5f});
  w.add("bf16", Dtype::BF16, {3}, b.data());
  w.add("i32", Dtype::I32, {2}, i32.data());
  w.add("u8", Dtype::U8, {2}, u8.data());
  w.add("i64", Dtype::I64, {2}, i64.data());
  w.write(path);
  SafetensorsFile f = SafetensorsFile::open(path);

  CHECK(read_as_f32(f, "f32", Shape{2, 3}) == std::vector<float>{1, 2, 3, 4, 5, 6.5f});
  CHECK(read_as_f32(f, "bf16") == std::vector<float>{1, -2, INFINITY});
  CHECK(read_as_bf16(f, "bf16", Shape{3}) == b);
  CHECK(read_as_bf16(f, "f32") == std::vector<bf16>{0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40d0});
  CHECK(read_as_i64(f, "i32") == std::vector<std::int64_t>{-1, 7});
  CHECK(read_as_i64(f, "u8") == std::vector<std::int64_t>{0, 200});
  CHECK(read_as_i64(f, "i64", Shape{2}) == i64);
  CHECK(read_as_f32(f, "i64") == std::vector<float>{static_cast<float>(1ll << 40), -3.f});

  std::string msg = error_of([&] { read_as_f32(f, "f32", Shape{3, 2}); }, ErrorKind::invalid_argument);
  CHECK(msg == path + ": tensor 'f32' has shape [2, 3], expected [3, 2]");
  msg = error_of([&] { read_as_i64(f, "f32"); }, ErrorKind::invalid_argument);
  CHECK(msg.find("F32") != std::string::npos);
  msg = error_of([&] { read_as_bf16(f, "i64"); }, ErrorKind::invalid_argument);
  CHECK(msg.find("I64") != std::string::npos);
  msg = error_of([&] { f.get("nope"); }, ErrorKind::bad_file);
  CHECK(msg == path + ": no tensor 'nope'");
  error_of([&] { read_as_f32(f, "nope"); }, ErrorKind::bad_file);
}

TEST_CASE("reads every fixture file, and rewrites each as Python did", "[safetensors][fixtures]") {
  TempDir tmp;
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(TILEMOE_TEST_DATA)) {
    if (e.path().extension() != ".safetensors") continue;
    ++files;
    std::string path = e.path().string();
    INFO(path);
    SafetensorsFile f = SafetensorsFile::open(path);
    REQUIRE_FALSE(f.tensors().empty());
    SafetensorsWriter w;
    for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
    for (const TensorInfo& t : f.tensors()) {
      CHECK(read_as_f32(f, t.name, t.shape).size() == static_cast<std::size_t>(t.numel()));
      w.add(t.name, t.dtype, t.shape, f.data(t));
    }
    // Same tensors, same order of data: only the order of header keys may differ.
    std::string out = tmp.file("rewrite.safetensors");
    w.write(out);
    std::string a = read_bytes(path), b = read_bytes(out);
    REQUIRE(a.size() == b.size());
    CHECK(header_len(a) == header_len(b));
    CHECK(a.compare(8 + header_len(a), std::string::npos, b, 8 + header_len(b)) == 0);
  }
  CHECK(files >= 10);

  std::string data = TILEMOE_TEST_DATA;
  SafetensorsFile ref = SafetensorsFile::open(data + "/deepseek_tiny/reference.safetensors");
  CHECK(ref.metadata().empty());
  CHECK(ref.get("layer_1.input").dtype == Dtype::BF16);
  CHECK(ref.get("layer_1.input").shape == Shape{13, 320});
  CHECK(ref.get("layer_1.weights").dtype == Dtype::F32);
  CHECK(ref.get("layer_2.output").shape == Shape{13, 320});
  std::vector<std::int64_t> ids = read_as_i64(ref, "layer_1.expert_ids", Shape{13, 2});
  CHECK(ref.get("layer_1.expert_ids").dtype == Dtype::I64);
  CHECK(std::all_of(ids.begin(), ids.end(), [](std::int64_t i) { return i >= 0 && i < 8; }));
  std::vector<float> w = read_as_f32(ref, "layer_1.weights", Shape{13, 2});
  CHECK(std::all_of(w.begin(), w.end(), [](float x) { return x > 0.f && x <= 1.f; }));

  SafetensorsFile adapter = SafetensorsFile::open(data + "/deepseek_tiny/adapter/adapter_model.safetensors");
  CHECK(adapter.metadata().at("format") == "pt");
  const TensorInfo& a = adapter.get("base_model.model.model.layers.1.mlp.experts.0.down_proj.lora_A.weight");
  CHECK((a.dtype == Dtype::BF16 && a.shape == Shape{8, 176}));

  // Every weight of the sharded checkpoint is in the shard its index names, shaped as config.json says.
  std::ifstream index_in(data + "/deepseek_tiny/model/model.safetensors.index.json");
  auto index = nlohmann::json::parse(index_in);
  std::map<std::string, SafetensorsFile> shards;
  for (const auto& [key, shard] : index["weight_map"].items()) {
    auto name = shard.get<std::string>();
    if (!shards.count(name))
      shards.emplace(name, SafetensorsFile::open(data + "/deepseek_tiny/model/" + name));
    const TensorInfo* t = shards.at(name).find(key);
    REQUIRE(t != nullptr);
    CHECK(t->dtype == Dtype::BF16);
    if (key.find(".experts.") != std::string::npos)
      CHECK((t->shape == Shape{176, 320} || t->shape == Shape{320, 176}));
    else
      CHECK(t->shape == Shape{8, 320});  // the router
  }
  CHECK(shards.size() == 2);
}

TEST_CASE("malformed headers are refused, naming the file and the tensor", "[safetensors][malformed]") {
  TempDir t;
  const std::string f32x2 = entry("w", "\"F32\"", "[2]", "[0,8]");
  const std::string eight(8, 'x');
  expect_bad(t, "", {"empty"});
  expect_bad(t, "12345", {"5 bytes"});
  expect_bad(t, st_bytes("{}", "", 0), {"header length is 0"});
  expect_bad(t, st_bytes("{\"a\":1}", "", 3), {"not valid JSON"});
  expect_bad(t, st_bytes("{}", "", 100), {"runs past the end"});
  expect_bad(t, st_bytes("{}", "", ~0ull), {"exceeds the limit"});
  expect_bad(t, st_bytes("{abc"), {"not valid JSON"});
  expect_bad(t, st_bytes("{\"a\xff\":1}"), {"not valid JSON"});
  expect_bad(t, st_bytes(std::string("{}\0\0", 4)), {"not valid JSON"});
  expect_bad(t, st_bytes(std::string("{}\0\x01garbage", 11)), {"NUL byte"});
  expect_bad(t, st_bytes("[1,2]"), {"not a JSON object"});
  expect_bad(t, st_bytes("null"), {"not a JSON object"});
  expect_bad(t, st_bytes("{\"w\":5}"), {"not an object", "(tensor 'w')"});
  expect_bad(t, st_bytes("{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", eight),
             {"no 'dtype'", "(tensor 'w')"});
  expect_bad(t, st_bytes("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", eight),
             {"no 'shape'", "(tensor 'w')"});
  expect_bad(t, st_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", eight),
             {"no 'data_offsets'", "(tensor 'w')"});
  expect_bad(t, st_bytes(obj({entry("w", "\"FOO\"", "[2]", "[0,8]")}), eight),
             {"dtype 'FOO'", "(tensor 'w')"});
  expect_bad(t, st_bytes(obj({entry("w", "\"F64\"", "[1]", "[0,8]")}), eight),
             {"dtype 'F64'", "(tensor 'w')"});
  expect_bad(t, st_bytes(obj({entry("w", "5", "[2]", "[0,8]")}), eight), {"dtype is 5", "(tensor 'w')"});
  for (const char* shape : {"[-1,2]", "[2.0]", "[\"2\"]", "[null]", "[18446744073709551615]", "[1e30]"})
    expect_bad(t, st_bytes(obj({entry("w", "\"F32\"", shape, "[0,8]")}), eight),
               {"shape entry", "(tensor 'w')"});
  expect_bad(t, st_bytes(obj({entry("w", "\"F32\"", "6", "[0,8]")}), eight), {"shape is 6", "(tensor 'w')"});
  for (const char* shape : {"[4294967296,4294967296,16]", "[9223372036854775807,2]", "[4611686018427387904]",
                            "[1099511627776,1099511627776,0]"})
    expect_bad(t, st_bytes(obj({entry("w", "\"F32\"", shape, "[0,8]")}), eight),
               {"overflows", "(tensor 'w')"});
  for (const char* offs : {"\"x\"", "[0]", "[0,4,8]", "[-4,4]", "[0,8.0]", "[0,null]"})
    expect_bad(t, st_bytes(obj({entry("w", "\"F32\"", "[2]", offs)}), eight),
               {"data_offsets is not", "(tensor 'w')"});
  expect_bad(t, st_bytes(obj({entry("w", "\"F32\"", "[0]", "[8,4]")}), eight),
             {"begin after end", "(tensor 'w')"});
  expect_bad(t, st_bytes(obj({entry("w", "\"F32\"", "[2]", "[0,4]")}), eight),
             {"hold 4 bytes", "needs 8", "(tensor 'w')"});
  expect_bad(t, st_bytes(obj({f32x2}), "1234"), {"past the data section", "(tensor 'w')"});
  expect_bad(
      t, st_bytes(obj({entry("w", "\"U8\"", "[7]", "[18446744073709551608,18446744073709551615]")}), eight),
      {"past the data section", "(tensor 'w')"});
  std::string twelve(12, 'x'), sixteen(16, 'x');
  expect_bad(
      t,
      st_bytes(obj({entry("a", "\"F32\"", "[2]", "[0,8]"), entry("b", "\"F32\"", "[2]", "[4,12]")}), twelve),
      {"overlaps", "tensor 'a'", "(tensor 'b')"});
  expect_bad(
      t, st_bytes(obj({entry("a", "\"F32\"", "[2]", "[0,8]"), entry("b", "\"I64\"", "[1]", "[0,8]")}), eight),
      {"overlaps", "'a'", "'b'"});
  expect_bad(t,
             st_bytes(obj({entry("a", "\"F32\"", "[4]", "[0,16]"), entry("b", "\"BF16\"", "[1]", "[6,8]"),
                           entry("c", "\"F32\"", "[1]", "[12,16]")}),
                      sixteen),
             {"overlaps", "tensor 'a'"});
  expect_bad(t, st_bytes("{\"__metadata__\":5}"), {"__metadata__ is 5"});
  expect_bad(t, st_bytes("{\"__metadata__\":{\"k\":1}}"), {"__metadata__ value for 'k'"});
  expect_bad(t, st_bytes("{\"__metadata__\":{\"k\":{}}}"), {"__metadata__ value for 'k'"});
  expect_bad(t, st_bytes(obj({f32x2, f32x2}), eight), {"duplicate key 'w'"});
  expect_bad(t, st_bytes("{\"w\":" + std::string(100000, '[') + std::string(100000, ']') + "}"),
             {"nests deeper"});
  expect_bad(t, st_bytes(obj({entry("a\\nb", "\"FOO\"", "[2]", "[0,8]")}), eight), {"(tensor 'a\\x0ab')"});

  // Refused only for what is wrong: zero-size tensors may sit anywhere, gaps are tolerated.
  std::string ok = t.file("ok.safetensors");
  write_bytes(ok,
              st_bytes(obj({entry("a", "\"F32\"", "[2]", "[0,8]"), entry("z", "\"BF16\"", "[0,5]", "[4,4]"),
                            entry("g", "\"U8\"", "[2]", "[10,12]")}),
                       twelve));
  SafetensorsFile f = SafetensorsFile::open(ok);
  CHECK(f.get("z").numel() == 0);
  CHECK(read_as_f32(f, "z").empty());
  CHECK(f.get("g").nbytes == 2);
}

TEST_CASE("truncated, lying and mutated files never crash", "[safetensors][malformed]") {
  TempDir t;
  std::vector<float> v(6, 1.5f);
  std::vector<std::int64_t> ids{1, 2, 3};
  SafetensorsWriter w;
  w.add("a", Dtype::F32, {2, 3}, v.data());
  w.add("b", Dtype::I64, {3}, ids.data());
  w.set_metadata("format", "pt");
  std::string good_path = t.file("good.safetensors");
  w.write(good_path);
  const std::string good = read_bytes(good_path);
  const std::uint64_t n = header_len(good);
  for (std::size_t cut = 0; cut < good.size(); ++cut) {
    INFO("cut at " << cut);
    expect_bad(t, good.substr(0, cut));
  }
  expect_bad(t, u64le(n - 9) + good.substr(8), {"not valid JSON"});
  expect_bad(t, u64le(n + 8) + good.substr(8), {"not valid JSON"});

  std::mt19937 rng(1234);
  std::string path = t.file("mutant.safetensors");
  write_bytes(path, good);
  int opened = 0;
  for (int i = 0; i < 1500; ++i) {
    std::string m = good;
    int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      // Header bytes more often, and JSON-ish characters half the time, to get past the parser.
      const std::size_t span = rng() % 2 ? m.size() : 8 + n;
      const std::size_t at = rng() % span;
      m[at] = rng() % 2 ? static_cast<char>(rng()) : "0123456789[]{},\":-.e "[rng() % 21];
    }
    // In place, not truncated: ext4 flushes a file truncated and rewritten at close (slow).
    std::fstream(path, std::ios::binary | std::ios::in | std::ios::out).write(m.data(), m.size());
    try {
      SafetensorsFile f = SafetensorsFile::open(path);
      ++opened;
      for (const TensorInfo& ti : f.tensors())
        CHECK(read_as_f32(f, ti.name).size() == static_cast<std::size_t>(ti.numel()));
    } catch (const Error& e) { CHECK(e.kind() == ErrorKind::bad_file); }
  }
  CHECK(opened > 0);
}

TEST_CASE("open names the path and the system's reason", "[safetensors][malformed]") {
  TempDir t;
  expect_bad_path(t.file("missing.safetensors"), {"No such file or directory"});
  expect_bad_path(t.dir.string(), {"is a directory"});
  std::string fifo = t.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  expect_bad_path(fifo, {"not a regular file"});
  // A header over 100 MB is refused for its length alone (the file is sparse: no disk used).
  std::string huge = t.file("huge.safetensors");
  write_bytes(huge, u64le(100'000'001));
  fs::resize_file(huge, 8 + 100'000'001 + 8);
  expect_bad_path(huge, {"exceeds the limit"});
}

TEST_CASE("writer refuses bad input and never leaves a partial file", "[safetensors][writer]") {
  TempDir t;
  std::string path = t.file("out.safetensors");
  std::vector<float> v{1, 2};
  auto refused = [&](auto&& setup, std::string_view needle) {
    SafetensorsWriter w;
    setup(w);
    std::string msg = error_of([&] { w.write(path); }, ErrorKind::invalid_argument);
    INFO(msg);
    CHECK(msg.find(needle) != std::string::npos);
    CHECK(t.listing().empty());
  };
  using W = SafetensorsWriter;
  // clang-format off
  refused([&](W& w) { w.add_f32("x", {2}, v); w.add("x", Dtype::F32, {2}, v.data()); }, "'x' is added twice");
  refused([&](W& w) { w.add_f32("x", {3}, v); }, "2 values");
  refused([&](W& w) { w.add_f32("__metadata__", {2}, v); }, "reserved");
  refused([&](W& w) { w.add("x", Dtype::F32, {-2}, v.data()); }, "negative");
  refused([&](W& w) { w.add("x", Dtype::F32, {2}, nullptr); }, "no data");
  refused([&](W& w) { w.add_streamed("x", Dtype::F32, {2}, nullptr); }, "no data");
  refused([&](W& w) { w.add("x", Dtype::I64, {1ll << 62, 4}, v.data()); }, "too large");
  refused([&](W& w) { w.add_f32("bad\xff", {2}, v); }, "UTF-8");
  // clang-format on

  SafetensorsWriter ok;
  ok.add_f32("x", {2}, v);
  auto io_error = [&](const std::string& target, std::string_view reason) {
    std::string msg = error_of([&] { ok.write(target); }, ErrorKind::bad_file);
    INFO(msg);
    CHECK(msg.rfind(target + ": ", 0) == 0);
    CHECK(msg.find(reason) != std::string::npos);
  };
  io_error(t.file("no_such_dir/out.safetensors"), "No such file or directory");
  write_bytes(t.file("plain"), "x");
  io_error(t.file("plain/out.safetensors"), "Not a directory");
  fs::create_directory(t.file("sub"));
  io_error(t.file("sub"), "Is a directory");  // fails at the rename: the temporary must go
  CHECK(t.listing() == std::vector<std::string>{"plain", "sub"});
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directory(t.file("ro"));
    ::chmod(t.file("ro").c_str(), 0500);
    io_error(t.file("ro/out.safetensors"), "Permission denied");
    CHECK(fs::is_empty(t.file("ro")));
  }

  // A failing Fill leaves the previous file untouched and no temporary behind.
  ok.write(path);
  const std::string before = read_bytes(path);
  SafetensorsWriter failing;
  failing.add_f32("y", {1}, {3});
  failing.add_streamed("z", Dtype::BF16, {4},
                       [](std::byte*, std::size_t) { throw std::runtime_error("boom"); });
  CHECK_THROWS_AS(failing.write(path), std::runtime_error);
  CHECK(read_bytes(path) == before);
  CHECK(t.listing() == std::vector<std::string>{"out.safetensors", "plain", "sub"});
}

// Hidden (run with "[.large]"): a file over 4 GB, streamed without a buffer of its size.
TEST_CASE("files over 4 GB", "[.large]") {
  TempDir t;
  struct statvfs vfs {};
  if (::statvfs(t.dir.c_str(), &vfs) != 0 || vfs.f_bavail * vfs.f_frsize < (12ull << 30)) {
    WARN("skipped: less than 12 GB free");
    return;
  }
  const std::uint64_t big = (4ull << 30) + 4099;
  SafetensorsWriter w;
  w.add_streamed("big", Dtype::U8, {static_cast<std::int64_t>(big)}, [&](std::byte* dst, std::size_t n) {
    REQUIRE(n == big);
    dst[0] = std::byte{1};  // the rest stays as fallocate left it: zeros
    dst[n - 1] = std::byte{2};
  });
  w.add_streamed("zz_tail", Dtype::U8, {3}, [](std::byte* dst, std::size_t) { std::memset(dst, 7, 3); });
  std::string path = t.file("big.safetensors");
  w.write(path);
  SafetensorsFile f = SafetensorsFile::open(path);
  const TensorInfo& b = f.get("big");
  const TensorInfo& tail = f.get("zz_tail");
  CHECK(tail.offset > (4ull << 30));
  CHECK(f.data(b)[0] == std::byte{1});
  CHECK(f.data(b)[big - 1] == std::byte{2});
  CHECK(read_as_i64(f, "zz_tail") == std::vector<std::int64_t>{7, 7, 7});
}
