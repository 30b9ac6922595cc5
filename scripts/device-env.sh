# Sourced by the device scripts (device-ab.sh, issue-tables.sh): unpacks the carried Debian packages
# (.devdeps, ../shared/device/README.md) into /opt/deps and points CMake, the compiler and the
# loader at them; the device has no network and lacks oneDNN, CLI11, nlohmann-json and hwloc's headers.
mkdir -p /opt/deps && for f in .devdeps/*.deb; do dpkg -x "$f" /opt/deps; done
export CMAKE_PREFIX_PATH=/opt/deps/usr LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu
if [ ! -f /usr/include/hwloc.h ]; then
  export PKG_CONFIG_PATH=/opt/deps/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=/opt/deps
  export CPATH=/opt/deps/usr/include LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu
fi
