#!/usr/bin/env bash
# Prepares what the power-cut test (cli/tests/power_cut.rs) boots: installs the Debian packages
# it runs (qemu, nbdkit, busybox-static, kmod, cpio, e2fsprogs) where they are missing, and
# unpacks a Debian kernel with the few modules the guest needs (virtio disk and network,
# ext4) into a cache directory keyed by the kernel package's name and version. The kernel is
# never installed on this machine: it is only booted by qemu.
#
#   scripts/power-cut-vm.sh            # prints the directory; the test finds it by itself
#   export PICOMQ_VM_DIR=$(scripts/power-cut-vm.sh | tail -1)   # or name it explicitly
#
# A rerun with the kernel cached and the packages installed does nothing (no apt-get). The
# cache is $PICOMQ_VM_CACHE (default /var/cache/picomq-vm); `current` in it points at the
# kernel the test uses by default.
set -euo pipefail

cache=${PICOMQ_VM_CACHE:-/var/cache/picomq-vm}
updated=
apt_update() {
  if [ -z "$updated" ]; then
    apt-get update -qq
    updated=1
  fi
}

missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
command -v nbdkit >/dev/null || missing+=(nbdkit)
# The guest's shell and tools: a static busybox needs no libraries in the initramfs.
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || missing+=(busybox-static)
command -v modinfo >/dev/null || missing+=(kmod)
command -v cpio >/dev/null || missing+=(cpio)
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
if [ ${#missing[@]} -gt 0 ]; then
  echo "power-cut-vm: installing ${missing[*]}" >&2
  apt_update
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# The kernel package linux-image-amd64 depends on (linux-image-6.1.0-57-amd64, ...), and its
# version. Without the package lists (a fresh machine) apt learns them first.
kernel_package() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}
package=$(kernel_package)
if [ -z "$package" ]; then
  apt_update
  package=$(kernel_package)
fi
if [ -z "$package" ]; then
  # No network and no lists: a kernel cached earlier still does.
  if [ -f "$cache/current/ready" ]; then
    echo "power-cut-vm: apt knows no linux-image-amd64; using the cached $(readlink "$cache/current")" >&2
    echo "$cache/current"
    exit 0
  fi
  echo "power-cut-vm: apt knows no linux-image-amd64 and nothing is cached in $cache" >&2
  exit 1
fi
version=$(apt-cache policy "$package" | awk '/Candidate:/ { print $2; exit }')
dir=$cache/$package-$version

if [ ! -f "$dir/ready" ]; then
  echo "power-cut-vm: unpacking $package $version into $dir" >&2
  work=$(mktemp -d /tmp/picomq-vm.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  # apt drops root to _apt for downloads; let it write here.
  chown _apt "$work" 2>/dev/null || true
  (cd "$work" && apt-get download -qq "$package=$version" >&2)
  dpkg-deb -x "$work"/*.deb "$work/x"
  release=${package#linux-image-}
  modules=$work/x/lib/modules/$release
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp/modules"
  cp "$work/x/boot/vmlinuz-$release" "$dir.tmp/vmlinuz"

  # The modules the guest loads, each after what it depends on (modinfo's `depends`), in the
  # order written to modules/order. Names use `_`; some files use `-` (crc32c-intel.ko).
  declare -A path_of=()
  while IFS= read -r file; do
    name=$(basename "$file")
    name=${name%%.ko*}
    path_of[${name//-/_}]=$file
  done < <(find "$modules/kernel" -name '*.ko*')
  declare -A placed=()
  order=()
  place() {
    local name=$1 dep
    [ -n "${placed[$name]:-}" ] && return
    placed[$name]=1
    local file=${path_of[$name]:-}
    if [ -z "$file" ]; then
      # Built into this kernel: nothing to load.
      grep -q "/$name.ko" "$modules/modules.builtin" && return
      grep -q "/${name//_/-}.ko" "$modules/modules.builtin" && return
      echo "power-cut-vm: module $name is neither in $package nor built in" >&2
      exit 1
    fi
    for dep in $(modinfo -F depends "$file" | tr ',' ' '); do
      place "${dep//-/_}"
    done
    case $file in
      *.ko) cp "$file" "$dir.tmp/modules/$name.ko" ;;
      *.ko.xz) xz -dc "$file" >"$dir.tmp/modules/$name.ko" ;;
      *.ko.zst) zstd -qdc "$file" >"$dir.tmp/modules/$name.ko" ;;
      *.ko.gz) gzip -dc "$file" >"$dir.tmp/modules/$name.ko" ;;
      *) echo "power-cut-vm: cannot unpack $file" >&2; exit 1 ;;
    esac
    order+=("$name.ko")
  }
  # virtio_pci: the PCI transport of the disk and the network card; crc32c: ext4's checksums
  # (the kernel would ask modprobe for it at mount time, which an initramfs without
  # modules.dep cannot answer).
  for module in virtio_pci virtio_blk virtio_net crc32c_generic ext4; do
    place "$module"
  done
  printf '%s\n' "${order[@]}" >"$dir.tmp/modules/order"
  echo "$package $version" >"$dir.tmp/ready"
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
fi
ln -sfn "$dir" "$cache/current"
echo "power-cut-vm: kernel $package $version in $dir" >&2
echo "$dir"
