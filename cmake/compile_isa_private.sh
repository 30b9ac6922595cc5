#!/usr/bin/env bash
# The C++ compiler launcher of every target (cmake/CompilerFlags.cmake):
#   compile_isa_private.sh READELF OBJCOPY -- [another launcher] COMPILER ARGS...
# It runs the compile, then, if ARGS hold an ISA's flags (-mamx-tile, -mavx512f, -mavx2), makes the
# object's copies of shared inline functions and templates its own.
#
# Why: an inline function or template instance (a vector's _M_default_append, a header's helper)
# is a weak symbol in a COMDAT group, and the linker keeps one copy for the whole program, from
# whichever object it meets first. A copy compiled with -mavx512f, handed to baseline code, faults
# on a CPU without AVX-512. Which copy wins, and which functions are emitted out of line at all,
# changes with the optimisation level and the sanitizers, so no list of fixes in the sources
# holds; renaming does. Every weak function the object defines, and each COMDAT group keyed by one
# of them or by a local alias (a constructor's C5 group), gets the suffix .tilemoe_<isa>: objects
# of one ISA still share one copy, and no other object can pick it. Weak data (a function's static
# local, typeinfo, a guard variable) keeps its name, so there is still one of each in the program.
# tests/build/test_isa_objects.sh checks the result.
set -u
readelf=$1 objcopy=$2
shift 2
[ "${1:-}" = "--" ] && shift

"$@" || exit $?

isa=
out=
previous=
for arg in "$@"; do
  case "$arg" in
    -mamx-tile) isa=amx ;;
    -mavx512f) [ "$isa" = amx ] || isa=avx512 ;;
    -mavx2) [ -n "$isa" ] || isa=avx2 ;;
  esac
  [ "$previous" = "-o" ] && out=$arg
  previous=$arg
done
[ -n "$isa" ] && [ -n "$out" ] || exit 0
case "$out" in *.o | *.obj) ;; *) exit 0 ;; esac # -E, -S, a dependency scan

map="$out.private-symbols"
{
  # Symbol table rows: Num: Value Size Type Bind Vis Ndx Name
  "$readelf" -sW "$out" | awk '$4 == "FUNC" && $5 == "WEAK" && $7 != "UND" { print $8 }'
  # Groups keyed by a weak function or a local symbol (GCC's C5/D5 constructor and destructor
  # groups); groups keyed by weak data stay shared.
  local_syms=$("$readelf" -sW "$out" | awk '$5 == "LOCAL" && $4 == "NOTYPE" && $8 != "" { print $8 }')
  "$readelf" -gW "$out" | sed -n "s/^COMDAT group section \[ *[0-9]*\] \`\.group' \[\(.*\)\] contains.*/\1/p" |
    grep -Fxf <(printf '%s\n' "$local_syms") || true
} | sort -u | awk -v suffix=".tilemoe_$isa" 'NF { print $1, $1 suffix }' > "$map"

status=0
if [ -s "$map" ]; then
  "$objcopy" --redefine-syms="$map" "$out" || status=$?
fi
rm -f "$map"
if [ "$status" -ne 0 ]; then
  echo "compile_isa_private.sh: $objcopy could not rename the shared inline functions of $out" >&2
  rm -f "$out"
fi
exit "$status"
