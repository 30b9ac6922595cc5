#!/usr/bin/env bash
# The objects compiled for an ISA (file names *_avx512.cpp, *_amx.cpp, *_avx2.cpp: cmake/CompilerFlags.cmake;
# the portable kernels' AVX2 build, tilemoe_amx_avx2) must not hand the program their copy of a
# shared inline function or template (a weak, COMDAT symbol: a vector's _M_default_append, a
# header's helper). The linker keeps one copy of each, from whichever object comes first; if that
# is an AVX-512 build of it, baseline code that calls it faults on a CPU without AVX-512.
# cmake/compile_isa_private.sh renames such copies to NAME.tilemoe_<isa> after each ISA compile.
# This checks the objects it left: every other weak function an ISA object defines must be free of
# VEX/EVEX instructions (mnemonics starting with v), opmask registers and xmm16-31, and no ISA
# object may define a weak vtable (it would point baseline callers at the object's private copies).
#   test_isa_objects.sh "obj;obj;..."   (CMake's $<TARGET_OBJECTS:...>, one argument)
set -u
IFS=';' read -ra objects <<< "${1:-}"
checked=0 failed=0 renamed=0
for o in "${objects[@]}"; do
  case "$o" in *_avx512.cpp.o | *_amx.cpp.o | *_avx2.cpp.o | */tilemoe_amx_avx2.dir/*) ;; *) continue ;; esac
  checked=$((checked + 1))
  weak=$(nm --defined-only "$o" | awk '$2 == "W" && $3 !~ /\.tilemoe_(avx2|avx512|amx)$/ { print $3 }')
  private=$(nm --defined-only "$o" | awk '$2 == "W" && $3 ~ /\.tilemoe_(avx2|avx512|amx)$/' | wc -l)
  renamed=$((renamed + private))
  vtables=$(nm --defined-only "$o" | awk '$2 == "V" && $3 ~ /^_ZT[VTC]/ { print $3 }')
  if [ -n "$vtables" ]; then
    failed=$((failed + 1))
    echo "$(basename "$o"): weak vtables (give the class a key function defined in a baseline file):"
    echo "$vtables" | c++filt | sed 's/^/  /'
  fi
  [ -n "$weak" ] || continue
  bad=$(objdump -d --no-show-raw-insn "$o" | awk -v list="$weak" '
    BEGIN { n = split(list, names, "\n"); for (i = 1; i <= n; ++i) weak[names[i]] = 1 }
    />:$/ { name = substr($2, 2, length($2) - 3); in_weak = (name in weak); next }
    in_weak && ($2 ~ /^v/ || /%k[1-7]|mm(1[6-9]|2[0-9]|3[01])/) { print name }' | sort -u)
  if [ -n "$bad" ]; then
    failed=$((failed + 1))
    echo "$(basename "$o"): weak functions with ISA instructions (not renamed: was it compiled through cmake/compile_isa_private.sh?):"
    echo "$bad" | c++filt | sed 's/^/  /'
  fi
done
if [ "$checked" -eq 0 ]; then
  echo "no ISA objects among the arguments"
  exit 1
fi
echo "$checked ISA objects checked, $failed with ISA code in a shared weak function or a weak vtable;" \
     "$renamed weak functions made private to their object"
[ "$failed" -eq 0 ]
