# The library runs on any x86-64: only kernel files are compiled for an ISA, chosen by their
# file name suffix, and are called only after runtime detection says the CPU has it.
add_compile_options(-Wall -Wextra -Wno-unused-parameter)
if(CMAKE_BUILD_TYPE STREQUAL "Release")
  add_compile_options(-O3)
endif()

if(TILEMOE_SANITIZE AND TILEMOE_TSAN)
  message(FATAL_ERROR "TILEMOE_SANITIZE (ASan + UBSan) and TILEMOE_TSAN cannot be combined: use two build trees")
endif()
if(TILEMOE_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
if(TILEMOE_TSAN)
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()

# Each ISA-compiled object keeps its copies of shared inline functions to itself (the script says
# why): the launcher renames them after the compile. A launcher the user set (ccache) still runs.
foreach(tool CMAKE_READELF CMAKE_OBJCOPY)
  if(NOT ${tool})
    message(FATAL_ERROR "${tool} not found (binutils): the ISA objects need it (cmake/compile_isa_private.sh)")
  endif()
endforeach()
set(CMAKE_CXX_COMPILER_LAUNCHER bash ${CMAKE_CURRENT_LIST_DIR}/compile_isa_private.sh ${CMAKE_READELF} ${CMAKE_OBJCOPY}
    -- ${CMAKE_CXX_COMPILER_LAUNCHER})

# The avx2 ISA, for the CPUs without AVX512-BF16: the *_avx2.cpp kernels, and the portable kernels
# without such a file compiled again (CMakeLists.txt).
set(TILEMOE_AVX2_FLAGS -mavx2 -mfma -mf16c)
set(TILEMOE_AVX512_FLAGS -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni -mfma -mf16c)
set(TILEMOE_AMX_TILE_FLAGS -mamx-tile -mamx-bf16 -mamx-int8)
set(TILEMOE_AMX_FLAGS ${TILEMOE_AVX512_FLAGS} ${TILEMOE_AMX_TILE_FLAGS})
if(TILEMOE_AMX_EMULATION)
  # Without the AMX flags, a tile intrinsic the emulation does not cover fails to compile instead
  # of running a real tile instruction on a CPU without AMX.
  set(TILEMOE_AMX_FLAGS ${TILEMOE_AVX512_FLAGS})
endif()

function(tilemoe_isa_flags_by_filename)
  foreach(f ${ARGN})
    get_filename_component(name ${f} NAME_WE)
    if(name MATCHES "_amx$")
      set_source_files_properties(${f} PROPERTIES COMPILE_OPTIONS "${TILEMOE_AMX_FLAGS}")
    elseif(name MATCHES "_avx512$")
      set_source_files_properties(${f} PROPERTIES COMPILE_OPTIONS "${TILEMOE_AVX512_FLAGS}")
    elseif(name MATCHES "_avx2$")
      # No FMA contraction: the avx2 kernels give the portable kernels' bits (CMakeLists.txt).
      set_source_files_properties(${f} PROPERTIES COMPILE_OPTIONS "${TILEMOE_AVX2_FLAGS};-ffp-contract=off")
    endif()
  endforeach()
endfunction()
