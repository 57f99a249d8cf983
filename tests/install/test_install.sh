#!/usr/bin/env bash
# The installed package, as a consumer sees it.
#
#   test_install.sh BUILD_DIR SOURCE_DIR VERSION HAVE_MPI MESON HAVE_MAN
#
# 1. `meson install --destdir STAGE --no-rebuild` of the built tree;
# 2. examples/trainer.cpp, copied out of the source tree, built twice against
#    STAGE only: with `pkg-config --cflags --libs meshpg` (PKG_CONFIG_PATH
#    into STAGE) and with a CMake project doing find_package(meshpg CONFIG
#    REQUIRED) + target_link_libraries(meshpg::meshpg) (CMAKE_PREFIX_PATH =
#    STAGE's prefix), which also checks the version rule of
#    meshpgConfigVersion.cmake;
# 3. each binary must resolve libmeshpg from STAGE (RUNPATH, ldd with
#    LD_LIBRARY_PATH cleared of any libmeshpg), then train: 8 thread-backend ranks, and 4
#    processes under mpirun when the MPI backend is built;
# 4. when the man pages were built (HAVE_MAN=1: scdoc was found), each of
#    meshpg.1, meshpg-spec.5 and meshpg.3 is installed under mandir and
#    `man -l` renders it without a warning; skipped, saying so, without
#    scdoc or man.
# Exit 0 on success, 1 on a failure, 77 (skip) only when cmake or pkg-config
# is missing.
set -euo pipefail

if [ $# -ne 6 ]; then
  echo "usage: $0 BUILD_DIR SOURCE_DIR VERSION HAVE_MPI MESON HAVE_MAN" >&2
  exit 1
fi
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
version=$3
have_mpi=$4
meson=$5
have_man=$6

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v cmake >/dev/null 2>&1 ||
  skip "cmake is not installed (Debian package cmake; bash tools/setup.sh test installs it)"
command -v pkg-config >/dev/null 2>&1 ||
  skip "pkg-config is not installed (Debian package pkg-config)"
cxx=${CXX:-c++}

t_start=$(date +%s%N)
step() { echo "== $* ($(( ($(date +%s%N) - t_start) / 1000000 )) ms)"; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/meshpg-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
stage=$tmp/stage
# Nothing from the build tree may leak into the runs.  The caller's search
# paths stay, behind the staged install: on clusters (environment modules,
# Spack, conda) and on the GPU machines of ../shared/gpu, the dependencies
# (hwloc, Open MPI, CUDA) are found only through PKG_CONFIG_PATH,
# CMAKE_PREFIX_PATH and LD_LIBRARY_PATH.  Whatever they hold, libmeshpg must
# come from the stage: resolves_staged checks that.
unset meshpg_DIR
caller_pc=${PKG_CONFIG_PATH:-}
caller_cmake=${CMAKE_PREFIX_PATH:-}
# prepend DIR PATH: DIR, then PATH's entries (if any), ':'-separated.
prepend() { if [ -n "$2" ]; then echo "$1:$2"; else echo "$1"; fi; }
# LD_LIBRARY_PATH keeps the caller's entries but none that holds a
# libmeshpg (meson test points it at the build tree).
kept=
IFS=: read -r -a lddirs <<<"${LD_LIBRARY_PATH:-}"
for d in "${lddirs[@]}"; do
  [ -n "$d" ] || continue
  compgen -G "$d/libmeshpg.so*" >/dev/null && continue
  kept=${kept:+$kept:}$d
done
if [ -n "$kept" ]; then export LD_LIBRARY_PATH=$kept; else unset LD_LIBRARY_PATH; fi

# ---------------------------------------------------------------------------
step "meson install --destdir $stage"
"$meson" install -C "$build" --destdir "$stage" --no-rebuild --quiet >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "meson install failed"; }

# Where meson put things: the build's prefix, libdir and includedir.
read -r prefix libdir includedir mandir < <("$meson" introspect "$build" --buildoptions | python3 -c '
import json, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
print(o["prefix"], o["libdir"], o["includedir"], o["mandir"])')
sprefix=$stage$prefix
case $libdir in /*) slib=$stage$libdir ;; *) slib=$sprefix/$libdir ;; esac
case $includedir in /*) sinc=$stage$includedir ;; *) sinc=$sprefix/$includedir ;; esac
case $mandir in /*) sman=$stage$mandir ;; *) sman=$sprefix/$mandir ;; esac

# ---------------------------------------------------------------------------
# The man pages: installed under mandir, and each renders.
if [ "$have_man" != 1 ]; then
  echo "SKIP (man pages): scdoc was not found when $build was configured, so the man" \
       "pages are not built (Debian package scdoc; bash tools/setup.sh test installs it)"
else
  step "man pages"
  for page in man1/meshpg.1 man5/meshpg-spec.5 man3/meshpg.3; do
    [ -s "$sman/$page" ] || fail "the staged install has no ${sman#"$stage"}/$page"
  done
  if ! command -v man >/dev/null 2>&1; then
    echo "SKIP (man pages): man is not installed (Debian package man-db), the installed" \
         "pages are not rendered"
  else
    for page in man1/meshpg.1 man5/meshpg-spec.5 man3/meshpg.3; do
      MANWIDTH=80 man --warnings -l "$sman/$page" >"$tmp/man.txt" 2>"$tmp/man.err" ||
        { cat "$tmp/man.err" >&2; fail "man -l $page failed"; }
      [ ! -s "$tmp/man.err" ] || { cat "$tmp/man.err" >&2; fail "man -l $page: warnings"; }
      grep -q '^NAME' "$tmp/man.txt" || fail "man -l $page: no NAME section in: $(head -5 "$tmp/man.txt")"
      echo "man -l $page: $(wc -l <"$tmp/man.txt") lines"
    done
  fi
fi
for f in "$sinc/meshpg.h" "$sinc/meshpg.hpp" "$slib/libmeshpg.so" "$slib/pkgconfig/meshpg.pc" \
         "$slib/cmake/meshpg/meshpgConfig.cmake" "$slib/cmake/meshpg/meshpgConfigVersion.cmake"; do
  [ -e "$f" ] || fail "the staged install has no ${f#"$stage"}"
done
grep -q '^prefix=${pcfiledir}/' "$slib/pkgconfig/meshpg.pc" ||
  fail "meshpg.pc is not relocatable ($(grep '^prefix=' "$slib/pkgconfig/meshpg.pc")): the" \
       "project sets pkgconfig.relocatable=true, but a build dir made before keeps its old" \
       "value: meson configure $build -Dpkgconfig.relocatable=true"

# The consumer's sources, outside the source and build trees.
app=$tmp/app
mkdir -p "$app"
cp "$src/examples/trainer.cpp" "$src/examples/seed.toml" "$app/"

# ---------------------------------------------------------------------------
step "pkg-config build"
pcpath=$(prepend "$slib/pkgconfig" "$caller_pc")
flags=$(PKG_CONFIG_PATH=$pcpath pkg-config --cflags --libs meshpg) ||
  fail "pkg-config --cflags --libs meshpg failed"
# The -L directory (relocatable: ${pcfiledir}/../..) must be the staged libdir.
ldir=
for f in $flags; do
  case $f in -L*) ldir=$(readlink -f "${f#-L}") ;; esac
done
[ "$ldir" = "$(readlink -f "$slib")" ] ||
  fail "pkg-config --libs does not point into the staged libdir $slib: $flags"
pc_version=$(PKG_CONFIG_PATH=$pcpath pkg-config --modversion meshpg)
[ "$pc_version" = "$version" ] || fail "pkg-config --modversion: $pc_version, want $version"
# shellcheck disable=SC2086
"$cxx" -std=c++17 -o "$app/trainer-pc" "$app/trainer.cpp" $flags -pthread \
  -Wl,-rpath,"$slib" || fail "building trainer.cpp with pkg-config flags failed"
# A C program that includes meshpg.h needs meshpg.pc alone: no other .pc
# file in sight (PKG_CONFIG_LIBDIR empties the default path), and none of
# the library's private flags (toml++'s -DTOML_*, MPI's include paths).
cflags_alone=$(PKG_CONFIG_LIBDIR=/nonexistent PKG_CONFIG_PATH="$slib/pkgconfig" \
  pkg-config --cflags --libs meshpg) ||
  fail "pkg-config --cflags --libs meshpg needs other packages' .pc files:" \
       "$(PKG_CONFIG_LIBDIR=/nonexistent PKG_CONFIG_PATH="$slib/pkgconfig" \
          pkg-config --cflags --libs meshpg 2>&1)"
case "$cflags_alone" in
  *TOML_*|*openmpi*|*hwloc*) fail "pkg-config --cflags meshpg leaks private flags: $cflags_alone" ;;
esac
cat >"$app/hello.c" <<'EOF_C'
#include <meshpg.h>
#include <stdio.h>
int main(void) {
  mpg_spec spec = MPG_SPEC_INIT;
  if (mpg_spec_init(&spec) != MPG_OK) return 1;
  printf("meshpg %s\n", mpg_version_string());
  return 0;
}
EOF_C
# shellcheck disable=SC2086
cc -std=c11 -Wall -Werror -o "$app/hello-c" "$app/hello.c" $cflags_alone -Wl,-rpath,"$slib" ||
  fail "building a C program with only meshpg.pc's flags failed: $cflags_alone"
"$app/hello-c" | grep -q "meshpg $version" || fail "the C program did not print meshpg $version"

# The soname CMake's target records is the library's own.
so_elf=$(readelf -d "$slib/libmeshpg.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
so_cmake=$(sed -n 's/.*IMPORTED_SONAME "\(.*\)".*/\1/p' "$slib/cmake/meshpg/meshpgConfig.cmake")
[ -n "$so_elf" ] && [ "$so_elf" = "$so_cmake" ] ||
  fail "IMPORTED_SONAME is \"$so_cmake\" but libmeshpg.so's SONAME is \"$so_elf\""
echo "soname $so_elf (ELF and CMake agree)"

# ---------------------------------------------------------------------------
step "cmake build"
IFS=. read -r vmaj vmin vpatch <<<"$version"
# find_package requests the version rule must refuse (meshpgConfigVersion.cmake).
refuse="$vmaj.$vmin.$((vpatch + 1));$((vmaj + 1)).0"
if [ "$vmaj" = 0 ]; then
  refuse="$refuse;0.$((vmin + 1))"
  [ "$vmin" -gt 0 ] && refuse="$refuse;0.$((vmin - 1))"
fi
docs_request=$(sed -n 's/^find_package(meshpg \([0-9.]*\) REQUIRED).*/\1/p' \
  "$src/docs/getting-started.md" | head -1)
[ -n "$docs_request" ] || fail "docs/getting-started.md shows no find_package(meshpg X.Y REQUIRED)"
cfg_request=$(sed -n 's/^#   find_package(meshpg \([0-9.]*\) REQUIRED).*/\1/p' \
  "$slib/cmake/meshpg/meshpgConfig.cmake" | head -1)
[ "$cfg_request" = "$docs_request" ] ||
  fail "meshpgConfig.cmake's comment asks for $cfg_request, docs/getting-started.md for $docs_request"
mkdir -p "$tmp/cmake-app"
cat >"$tmp/cmake-app/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.16)
project(meshpg_consumer LANGUAGES CXX)
find_package(meshpg $vmaj.$vmin CONFIG REQUIRED)
# The request that docs/getting-started.md and the installed config's own
# comment show must find this version.
find_package(meshpg $docs_request CONFIG REQUIRED)
if(NOT meshpg_VERSION STREQUAL "$version")
  message(FATAL_ERROR "meshpg_VERSION is \${meshpg_VERSION}, want $version")
endif()
get_target_property(_inc meshpg::meshpg INTERFACE_INCLUDE_DIRECTORIES)
get_target_property(_loc meshpg::meshpg IMPORTED_LOCATION)
get_target_property(_feat meshpg::meshpg INTERFACE_COMPILE_FEATURES)
message(STATUS "meshpg::meshpg: \${_loc}, include \${_inc}, features \${_feat}")
if(NOT _inc STREQUAL "$sinc" OR NOT _loc MATCHES "^$slib/libmeshpg"
   OR NOT _feat STREQUAL "cxx_std_17")
  message(FATAL_ERROR "meshpg::meshpg does not point into the staged prefix")
endif()
function(refuse request)
  find_package(meshpg \${request} CONFIG QUIET)
  if(meshpg_FOUND)
    message(FATAL_ERROR "find_package(meshpg \${request}) accepted meshpg \${meshpg_VERSION}")
  endif()
endfunction()
foreach(r IN ITEMS $refuse)
  refuse(\${r})
endforeach()
add_executable(trainer trainer.cpp)
target_link_libraries(trainer PRIVATE meshpg::meshpg)
find_package(Threads REQUIRED)
target_link_libraries(trainer PRIVATE Threads::Threads)
EOF
cp "$app/trainer.cpp" "$tmp/cmake-app/"
cmake -S "$tmp/cmake-app" -B "$tmp/cmake-build" \
  -DCMAKE_PREFIX_PATH="$(prepend "$sprefix" "$caller_cmake" | tr ':' ';')" \
  -DCMAKE_CXX_COMPILER="$(command -v "$cxx")" >"$tmp/cmake.log" 2>&1 ||
  { cat "$tmp/cmake.log" >&2; fail "cmake configure failed"; }
grep "meshpg::meshpg:" "$tmp/cmake.log" || true
cmake --build "$tmp/cmake-build" >"$tmp/cmake-build.log" 2>&1 ||
  { cat "$tmp/cmake-build.log" >&2; fail "cmake --build failed"; }
cp "$tmp/cmake-build/trainer" "$app/trainer-cmake"

# ---------------------------------------------------------------------------
# The binary finds libmeshpg in the staged libdir by its RUNPATH, and not
# through the caller's LD_LIBRARY_PATH (which wins over RUNPATH).
resolves_staged() {
  local bin=$1 runpath got
  runpath=$(readelf -d "$bin" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
  case ":$runpath:" in
    *":$slib:"*) ;;
    *) fail "$bin: RUNPATH \"$runpath\" does not name the staged libdir $slib" ;;
  esac
  case ":$runpath:" in *"$build"*) fail "$bin: RUNPATH names the build tree: $runpath" ;; esac
  got=$(ldd "$bin" | awk '$1 ~ /^libmeshpg\.so/ {print $3}')
  [ -n "$got" ] || fail "$bin: ldd finds no libmeshpg: $(ldd "$bin")"
  [ "$(readlink -f "$got")" = "$(readlink -f "$slib/libmeshpg.so")" ] ||
    fail "$bin: libmeshpg resolves to $got, not to the staged $slib"
  echo "$(basename "$bin"): libmeshpg -> $got"
}

# A run trained `steps` steps on `ranks` ranks with `backend`, and said OK.
expect_trained() {
  local what=$1 log=$2 ranks=$3 steps=$4 backend=$5 n
  grep -q "on $ranks ranks ($backend backend)" "$log" ||
    { cat "$log" >&2; fail "$what: no 'on $ranks ranks ($backend backend)' line"; }
  n=$(grep -c "grads ok on $ranks ranks" "$log" || true)
  [ "$n" = "$steps" ] || { cat "$log" >&2; fail "$what: $n of $steps steps say 'grads ok'"; }
  [ "$(grep -c '^OK$' "$log")" = 1 ] || { cat "$log" >&2; fail "$what: not exactly one OK"; }
}

mpirun_cmd=(timeout -k 5 120 mpirun --oversubscribe --bind-to none --mca btl self,vader
            --mca btl_vader_single_copy_mechanism none -np 4)
if [ "$have_mpi" = 1 ] && ! command -v mpirun >/dev/null 2>&1; then
  fail "the MPI backend is built but mpirun is missing (Debian package openmpi-bin)"
fi

for kind in pc cmake; do
  bin=$app/trainer-$kind
  resolves_staged "$bin"
  step "$kind: 8 ranks, thread backend"
  rc=0
  timeout -k 5 120 "$bin" "$app/seed.toml" --threads 8 --steps 2 >"$tmp/run.log" 2>&1 || rc=$?
  [ $rc = 0 ] || { cat "$tmp/run.log" >&2; fail "trainer-$kind --threads 8: exit $rc"; }
  expect_trained "trainer-$kind --threads 8" "$tmp/run.log" 8 2 thread
  grep "^trainer: mesh" "$tmp/run.log"
  if [ "$have_mpi" = 1 ]; then
    step "$kind: mpirun -np 4, mpi backend"
    rc=0
    "${mpirun_cmd[@]}" "$bin" "$app/seed.toml" --backend mpi --mesh dp=-1,cp=2,tp=2 --steps 2 \
      >"$tmp/run.log" 2>&1 || rc=$?
    [ $rc = 0 ] || { cat "$tmp/run.log" >&2; fail "mpirun -np 4 trainer-$kind: exit $rc"; }
    expect_trained "mpirun -np 4 trainer-$kind" "$tmp/run.log" 4 2 mpi
    grep "^trainer: mesh" "$tmp/run.log"
  else
    echo "(the MPI backend is not built: mpirun runs left out)"
  fi
done
step "done"
