// Kernels that run on any x86-64: the portable GEMM and epilogue, packing, ISA selection.
#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "amx/isa.hpp"
#include "amx/kernel_table.hpp"
#include "amx/one_row_tile_block.hpp"
#include "amx/pack_bf16.hpp"
#include "amx/zero_streaming.hpp"
#include "kernel_test_grid.hpp"
#include "test_util.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using namespace tilemoe::kernels;

TEST_CASE("portable kernels match the double reference") { kernels::test::check_kernels(Isa::portable); }

TEST_CASE("packed_shape pads n to panels of 16 and k to blocks of 32") {
  const PackedShape s = packed_shape(17, 33);
  CHECK(s.n == 17);
  CHECK(s.k == 33);
  CHECK(s.n_padded == 32);
  CHECK(s.k_padded == 64);
  CHECK(s.panels == 2);
  CHECK(s.kblocks == 2);
  CHECK(packed_bf16_elements(17, 33) == 32u * 64u);
  CHECK(packed_shape(16, 32).n_padded == 16);
  CHECK(packed_shape(16, 32).k_padded == 32);
  CHECK(packed_shape(0, 0).panels == 0);
  CHECK_THROWS_AS(packed_shape(-1, 4), Error);
}

TEST_CASE("packing follows the documented VNNI layout, pads with zeros and unpacks back") {
  std::mt19937 rng(3);
  for (auto [n, k] : {std::pair{1, 1}, {16, 32}, {17, 33}, {31, 100}, {48, 64}, {100, 200}}) {
    INFO("n=" << n << " k=" << k);
    const std::size_t ldw = k + 5;
    std::vector<bf16> w(n * ldw);
    for (bf16& v : w) v = kernels::test::random_bf16(rng);
    const PackedShape s = packed_shape(n, k);
    std::vector<bf16> packed(packed_bf16_elements(n, k), bf16{0xffff});
    pack_bf16_weights(w.data(), n, k, ldw, packed.data());
    bool layout_ok = true;
    for (int nb = 0; nb < s.panels; ++nb)
      for (int kb = 0; kb < s.kblocks; ++kb)
        for (int r = 0; r < 16; ++r)
          for (int c = 0; c < 16; ++c)
            for (int p = 0; p < 2; ++p) {
              const int col = nb * 16 + c, kk = kb * 32 + 2 * r + p;
              const bf16 want = col < n && kk < k ? w[col * ldw + kk] : bf16{0};
              layout_ok &= packed[((nb * s.kblocks + kb) * 16 + r) * 32 + c * 2 + p] == want;
            }
    CHECK(layout_ok);
    std::vector<bf16> back(n * ldw, bf16{0x4242});
    unpack_bf16_weights(packed.data(), n, k, back.data(), ldw);
    for (int col = 0; col < n; ++col)
      for (std::size_t kk = 0; kk < ldw; ++kk) {
        const std::size_t at = col * ldw + kk;
        if (back[at] != (kk < static_cast<std::size_t>(k) ? w[at] : bf16{0x4242})) FAIL("unpack at " << col << "," << kk);
      }
  }
}

TEST_CASE("store_row_tile writes scattered rows as pack_rows_as_tiles does, zero-padded, other rows untouched") {
  std::mt19937 rng(11);
  for (int n : {1, 31, 32, 33, 100, 2048, 2047})
    for (int extra_blocks : {0, 2})
      for (int count : {1, 7, 16}) {
        const int k_padded = (n + kBlockK - 1) / kBlockK * kBlockK + extra_blocks * kBlockK;
        // Source rows scattered through one buffer, in a shuffled order.
        std::vector<bf16> pool(static_cast<std::size_t>(20) * (n + 5));
        for (auto& v : pool) v = float_to_bf16(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 64.0f);
        std::vector<int> pick(20);
        std::iota(pick.begin(), pick.end(), 0);
        std::shuffle(pick.begin(), pick.end(), rng);
        std::vector<const bf16*> src;
        std::vector<bf16> rows(static_cast<std::size_t>(count) * k_padded, bf16{0});
        for (int r = 0; r < count; ++r) {
          src.push_back(pool.data() + static_cast<std::size_t>(pick[r]) * (n + 5));
          std::copy_n(src.back(), n, rows.data() + static_cast<std::size_t>(r) * k_padded);
        }
        std::vector<bf16> expect(tiled_rows_elements(16, k_padded), float_to_bf16(-7.0f));
        pack_rows_as_tiles(rows.data(), static_cast<std::size_t>(k_padded), count, k_padded, expect.data());
        std::vector<bf16> got(expect.size(), float_to_bf16(-7.0f));
        store_row_tile(src.data(), count, n, k_padded, got.data());
        INFO("n " << n << ", k_padded " << k_padded << ", rows " << count);
        std::size_t differ = 0;
        for (std::size_t i = 0; i < got.size(); ++i) differ += bf16_to_float(got[i]) != bf16_to_float(expect[i]);
        CHECK(differ == 0);
      }
}

TEST_CASE("f32 weights are packed rounded to nearest even") {
  const int n = 3, k = 5;
  std::vector<float> w = {1.0f, 1.00390625f, 1.01171875f, -2.5f, NAN, 1e-40f, 3.0e38f, -0.0f, 0.1f, 7.0f,
                          0.3f, 0.7f, -1e9f, 1e-3f, 2.0f};
  std::vector<bf16> expected_w(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) expected_w[i] = float_to_bf16(w[i]);
  std::vector<bf16> from_f32(packed_bf16_elements(n, k)), from_bf16(packed_bf16_elements(n, k));
  pack_f32_weights_to_bf16(w.data(), n, k, k, from_f32.data());
  pack_bf16_weights(expected_w.data(), n, k, k, from_bf16.data());
  CHECK(from_f32 == from_bf16);
  CHECK(float_to_bf16(1.00390625f) == 0x3f80);  // tie: to even
  CHECK(float_to_bf16(1.01171875f) == 0x3f82);  // tie: to even (up)
}

TEST_CASE("ISA names parse and print") {
  CHECK(parse_isa("portable") == Isa::portable);
  CHECK(parse_isa("avx512") == Isa::avx512_bf16);
  CHECK(parse_isa("avx512_bf16") == Isa::avx512_bf16);
  CHECK(parse_isa("amx") == Isa::amx_bf16);
  CHECK(parse_isa("amx_bf16") == Isa::amx_bf16);
  CHECK_FALSE(parse_isa("AMX").has_value());
  CHECK_FALSE(parse_isa("").has_value());
  for (Isa isa : {Isa::portable, Isa::avx512_bf16, Isa::amx_bf16}) CHECK(parse_isa(isa_name(isa)) == isa);
  CHECK(std::string(isa_name(Isa::avx512_bf16)) == "avx512");
}

TEST_CASE("availability and reasons agree with the detected features") {
  CHECK(isa_available(Isa::portable));
  CHECK(isa_unavailable_reason(Isa::portable).empty());
  for (Isa isa : {Isa::avx512_bf16, Isa::amx_bf16}) {
    INFO(isa_name(isa) << ": " << isa_unavailable_reason(isa));
    CHECK(isa_available(isa) == isa_unavailable_reason(isa).empty());
  }
  const CpuFeatures& f = cpu_features();
  CHECK(&f == &cpu_features());
  if (isa_available(Isa::amx_bf16)) {
    CHECK((f.os_amx_permitted || f.amx_emulated));
    CHECK(tile_instructions_usable());
    CHECK(isa_available(Isa::avx512_bf16));
    // An emulated AMX is never the automatic choice.
    CHECK(best_available_isa() == (f.amx_emulated ? Isa::avx512_bf16 : Isa::amx_bf16));
  } else {
    CHECK_FALSE(isa_unavailable_reason(Isa::amx_bf16).empty());
    CHECK_FALSE(tile_instructions_usable());
    CHECK(best_available_isa() != Isa::amx_bf16);
  }
  CHECK(isa_label(Isa::avx512_bf16) == "avx512");
  CHECK(isa_label(Isa::amx_bf16) == (f.amx_emulated ? "amx (emulated tiles)" : "amx"));
#if defined(TILEMOE_AMX_EMULATION)
  CHECK(f.amx_emulated == isa_available(Isa::avx512_bf16));
#else
  CHECK_FALSE(f.amx_emulated);
#endif
  if ((!f.amx_tile || !f.amx_bf16) && !f.amx_emulated) {
    CHECK(isa_unavailable_reason(Isa::amx_bf16).find("AMX") != std::string::npos);
  }
}

namespace {

struct ScopedIsaEnv : tilemoe::test::ScopedEnv {
  explicit ScopedIsaEnv(const char* value) : ScopedEnv("TILEMOE_ISA", value) {}
};

ErrorKind kind_of(std::string_view requested, std::string* message = nullptr) {
  try {
    resolve_isa(requested);
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.kind();
  }
  FAIL("resolve_isa('" << std::string(requested) << "') did not throw");
  return ErrorKind::state;
}

}  // namespace

TEST_CASE("resolve_isa picks the requested, the environment's or the best ISA") {
  SECTION("no request and no environment: the best available") {
    ScopedIsaEnv env(nullptr);
    CHECK(resolve_isa("") == best_available_isa());
    CHECK(resolve_isa("auto") == best_available_isa());
  }
  SECTION("TILEMOE_ISA decides when the request is empty or auto") {
    ScopedIsaEnv env("portable");
    CHECK(resolve_isa("") == Isa::portable);
    CHECK(resolve_isa("auto") == Isa::portable);
  }
  SECTION("an explicit request wins over TILEMOE_ISA") {
    ScopedIsaEnv env("bogus");
    CHECK(resolve_isa("portable") == Isa::portable);
  }
  SECTION("TILEMOE_ISA=auto is the best available") {
    ScopedIsaEnv env("auto");
    CHECK(resolve_isa("") == best_available_isa());
  }
  SECTION("unknown names are invalid arguments that list the valid ones") {
    ScopedIsaEnv env(nullptr);
    std::string message;
    CHECK(kind_of("sse2", &message) == ErrorKind::invalid_argument);
    CHECK(message.find("sse2") != std::string::npos);
    CHECK(message.find("portable") != std::string::npos);
    CHECK(message.find("amx") != std::string::npos);
  }
  SECTION("an unknown TILEMOE_ISA names the variable") {
    ScopedIsaEnv env("avx1024");
    std::string message;
    CHECK(kind_of("", &message) == ErrorKind::invalid_argument);
    CHECK(message.find("TILEMOE_ISA") != std::string::npos);
  }
  SECTION("an ISA this machine lacks is unsupported, with the reason") {
    ScopedIsaEnv env(nullptr);
    for (const char* name : {"amx", "avx512"}) {
      const Isa isa = *parse_isa(name);
      if (isa_available(isa)) {
        CHECK(resolve_isa(name) == isa);
        continue;
      }
      std::string message;
      CHECK(kind_of(name, &message) == ErrorKind::unsupported);
      CHECK(message.find(isa_unavailable_reason(isa)) != std::string::npos);
      ScopedIsaEnv from_env(name);
      CHECK(kind_of("", &message) == ErrorKind::unsupported);
      CHECK(message.find("TILEMOE_ISA") != std::string::npos);
    }
  }
}

TEST_CASE("the one-row tile block: the CPU's default, TILEMOE_ONE_ROW_BLOCK, a request, the process's setting") {
  CpuFeatures f;
  f.family = 6, f.model = 143;
  CHECK(default_one_row_tile_block(f) == OneRowTileBlock::quads);
  f.model = 207;
  CHECK(default_one_row_tile_block(f) == OneRowTileBlock::pairs);
  f.family = 25, f.model = 143;  // an AMD family with that model number
  CHECK(default_one_row_tile_block(f) == OneRowTileBlock::pairs);
  CHECK(cpu_features().family != 0);  // CPUID leaf 1 read

  auto error_of = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::make_pair(e.kind(), std::string(e.what()));
    }
    return std::make_pair(ErrorKind::state, std::string("no error"));
  };
  {
    tilemoe::test::ScopedEnv env("TILEMOE_ONE_ROW_BLOCK", nullptr);
    CHECK(resolve_one_row_tile_block("") == default_one_row_tile_block(cpu_features()));
    CHECK(resolve_one_row_tile_block("auto") == default_one_row_tile_block(cpu_features()));
    CHECK(resolve_one_row_tile_block("quads") == OneRowTileBlock::quads);
    CHECK(resolve_one_row_tile_block("pairs") == OneRowTileBlock::pairs);
    auto [kind, message] = error_of([] { resolve_one_row_tile_block("triples"); });
    CHECK(kind == ErrorKind::invalid_argument);
    CHECK(message.find("triples") != std::string::npos);
    CHECK(message.find("pairs") != std::string::npos);
  }
  {
    tilemoe::test::ScopedEnv env("TILEMOE_ONE_ROW_BLOCK", "quads");
    CHECK(resolve_one_row_tile_block("") == OneRowTileBlock::quads);
    CHECK(resolve_one_row_tile_block("pairs") == OneRowTileBlock::pairs);  // a request wins
  }
  {
    tilemoe::test::ScopedEnv env("TILEMOE_ONE_ROW_BLOCK", "quad");
    auto [kind, message] = error_of([] { resolve_one_row_tile_block(""); });
    CHECK(kind == ErrorKind::invalid_argument);
    CHECK(message.find("TILEMOE_ONE_ROW_BLOCK") != std::string::npos);
    // resolve_isa reports it where AMX is chosen, and nowhere else.
    CHECK_NOTHROW(resolve_isa("portable"));
    if (isa_available(Isa::amx_bf16)) CHECK(error_of([] { resolve_isa("amx"); }).first == ErrorKind::invalid_argument);
  }
  const OneRowTileBlock before = one_row_tile_block();
  set_one_row_tile_block(OneRowTileBlock::quads);
  CHECK(one_row_tile_block() == OneRowTileBlock::quads);
  set_one_row_tile_block(OneRowTileBlock::pairs);
  CHECK(one_row_tile_block() == OneRowTileBlock::pairs);
  set_one_row_tile_block(before);
}

TEST_CASE("kernel_table refuses an ISA this machine lacks") {
  CHECK(kernel_table(Isa::portable).gemm_bf16 == &gemm_bf16_portable);
  CHECK(kernel_table(Isa::portable).amx_min_rows == 0);
  for (Isa isa : {Isa::avx512_bf16, Isa::amx_bf16}) {
    if (isa_available(isa)) continue;
    try {
      kernel_table(isa);
      FAIL("kernel_table(" << isa_name(isa) << ") did not throw");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::unsupported);
    }
  }
}

TEST_CASE("zero_bytes_streaming zeroes exactly its range of bf16 at any alignment and length") {
  std::vector<tilemoe::bf16> buf(300);
  for (std::size_t offset : {0, 1, 2, 3, 7, 8, 9})
    for (std::size_t n : {0, 1, 3, 7, 8, 9, 31, 64, 129, 250}) {
      std::fill(buf.begin(), buf.end(), tilemoe::bf16{0x4040});
      tilemoe::kernels::zero_bytes_streaming(buf.data() + offset, n * sizeof(tilemoe::bf16));
      tilemoe::kernels::streaming_stores_done();
      for (std::size_t i = 0; i < buf.size(); ++i) {
        INFO("offset " << offset << " n " << n << " i " << i);
        REQUIRE(buf[i] == (i >= offset && i < offset + n ? 0 : 0x4040));
      }
    }
}

TEST_CASE("zero_floats_streaming zeroes exactly its range at any alignment and length") {
  std::vector<float> buf(300);
  for (std::size_t offset : {0, 1, 2, 3, 4, 5, 17})
    for (std::size_t n : {0, 1, 3, 4, 5, 16, 31, 64, 129, 250}) {
      std::fill(buf.begin(), buf.end(), 7.0f);
      tilemoe::kernels::zero_floats_streaming(buf.data() + offset, n);
      tilemoe::kernels::streaming_stores_done();
      for (std::size_t i = 0; i < buf.size(); ++i) {
        INFO("offset " << offset << " n " << n << " i " << i);
        REQUIRE(buf[i] == (i >= offset && i < offset + n ? 0.0f : 7.0f));
      }
    }
}
