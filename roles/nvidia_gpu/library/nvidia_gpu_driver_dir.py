#!/usr/bin/python
"""Ansible module: the node's NVIDIA driver user-space files in one directory (lib64/,
bin/, driver-version) for containers to bind at /usr/local/nvidia."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_gpu_driver_dir
short_description: Assemble the NVIDIA driver's user-space files for containers
description:
  - Finds the driver's libraries with C(ldconfig -p) (entries whose directory is one of
    I(lib_dirs), whose name is one of I(libraries) followed by C(.so) or C(.so.*)) and its
    programs in I(bin_dirs), and puts into I(path) C(lib64/) a hard link of each
    library's real file plus the names C(ldconfig) knows it by as symbolic links to it,
    C(bin/) a hard link of each program's real file, and C(driver-version).
  - A hard link where the directory is on the file's filesystem, else a copy (size and
    modification time kept). Every new entry is made under a temporary name and renamed
    into place, so a job that has the directory bound sees each file whole; what a
    running program has open stays as it was.
  - Entries of C(lib64/) and C(bin/) the driver no longer has (after a driver change)
    are removed. Changed only when the set of entries, a link's target or a file's
    inode (copies, size or modification time) differs. Supports check and diff mode.
options:
  path:
    description: The directory to assemble (made 0755 when missing).
    type: path
    required: true
  libraries:
    description: Library names without C(.so) (libcuda, libnvidia-ml, ...).
    type: list
    elements: str
    required: true
  lib_dirs:
    description: Directories whose C(ldconfig -p) entries count (the 64-bit library directory).
    type: list
    elements: path
    required: true
  binaries:
    description: Program names (nvidia-smi, ...); the ones not installed are left out.
    type: list
    elements: str
    default: []
  bin_dirs:
    description: Directories to look for the programs in, in order.
    type: list
    elements: path
    default: [/usr/bin]
  driver_version:
    description: What C(driver-version) holds; empty takes it from libcuda's file name
      (C(libcuda.so.550.54.14) -> C(550.54.14)), else C(unknown).
    type: str
    default: ""
author: TACC stack
"""

EXAMPLES = r"""
- name: Assemble the driver directory for containers
  nvidia_gpu_driver_dir:
    path: /usr/local/lib/tacc-nvidia
    libraries: [libcuda, libnvidia-ml]
    lib_dirs: [/usr/lib/x86_64-linux-gnu]
    binaries: [nvidia-smi]
"""

RETURN = r"""
libraries: {description: The file names in lib64/ (real files and links)., type: list,
  returned: always}
binaries: {description: The programs in bin/., type: list, returned: always}
driver_version: {description: What driver-version holds., type: str, returned: always}
"""

import errno  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import stat  # noqa: E402
from typing import NamedTuple  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

LIB64 = "lib64"
BIN = "bin"
VERSION_FILE = "driver-version"
TEMP_PREFIX = ".tacc-new-"
# `ldconfig -p` lines: "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1"
_LDCONFIG = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)(?:\s+OS ABI:[^=]*)?\s+=>\s+(\S+)\s*$")
_VERSION = re.compile(r"^libcuda\.so\.(\d+(?:\.\d+)+)$")


class Entry(NamedTuple):
    """One name in lib64/ or bin/: a hard link (or copy) of `source`, or a symbolic
    link to `link` (a name in the same directory)."""

    name: str  # "lib64/libcuda.so.1"
    source: str = ""
    link: str = ""


def ldconfig_entries(text: str) -> list[tuple[str, str]]:
    """`ldconfig -p` output as [(name, path)], in its order."""
    found = []
    for line in text.splitlines():
        match = _LDCONFIG.match(line)
        if match:
            found.append((match.group(1), match.group(3)))
    return found


def library_named(name: str, libraries: list[str]) -> bool:
    return any(name == f"{lib}.so" or name.startswith(f"{lib}.so.") for lib in libraries)


def wanted_libraries(
    entries: list[tuple[str, str]], libraries: list[str], lib_dirs: list[str]
) -> list[Entry]:
    """lib64/'s entries: each library's real file once, and each name ldconfig lists
    for it as a link to that file."""
    dirs = {os.path.realpath(d) for d in lib_dirs}
    files: dict[str, str] = {}  # real file name -> real path
    links: dict[str, str] = {}  # ldconfig name -> real file name
    for name, path in entries:
        if not library_named(name, libraries):
            continue
        if os.path.realpath(os.path.dirname(path)) not in dirs:  # another arch's, another place
            continue
        real = os.path.realpath(path)
        if not os.path.isfile(real):
            continue
        base = os.path.basename(real)
        files.setdefault(base, real)
        if name != base and files[base] == real:
            links.setdefault(name, base)
    wanted = [Entry(f"{LIB64}/{base}", source=real) for base, real in files.items()]
    wanted += [
        Entry(f"{LIB64}/{name}", link=base) for name, base in links.items() if name not in files
    ]
    return sorted(wanted, key=lambda e: e.name)


def wanted_binaries(binaries: list[str], bin_dirs: list[str]) -> list[Entry]:
    wanted = []
    for program in binaries:
        for directory in bin_dirs:
            path = os.path.join(directory, program)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                wanted.append(Entry(f"{BIN}/{program}", source=os.path.realpath(path)))
                break
    return sorted(wanted, key=lambda e: e.name)


def version_of(libraries: list[Entry], given: str) -> str:
    if given:
        return given
    for entry in libraries:
        match = _VERSION.match(os.path.basename(entry.name))
        if match and entry.source:
            return match.group(1)
    return "unknown"


def up_to_date(root: str, entry: Entry) -> bool:
    path = os.path.join(root, entry.name)
    try:
        here = os.lstat(path)
    except FileNotFoundError:
        return False
    if entry.link:
        return stat.S_ISLNK(here.st_mode) and os.readlink(path) == entry.link
    if not stat.S_ISREG(here.st_mode):
        return False
    there = os.stat(entry.source)
    if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
        return True
    # a copy (another filesystem): the same size, time and mode
    return (
        here.st_dev != there.st_dev
        and here.st_size == there.st_size
        and here.st_mtime_ns == there.st_mtime_ns
        and stat.S_IMODE(here.st_mode) == stat.S_IMODE(there.st_mode)
    )


def present(root: str) -> list[str]:
    """The names now in lib64/ and bin/ (temporary ones of an interrupted run included)."""
    names = []
    for sub in (LIB64, BIN):
        directory = os.path.join(root, sub)
        if os.path.isdir(directory) and not os.path.islink(directory):
            names += [f"{sub}/{name}" for name in os.listdir(directory)]
    return sorted(names)


def plan(root: str, wanted: list[Entry], version: str) -> tuple[list[Entry], list[str], list[str]]:
    """(entries to make, names to remove, directories to make or fix)."""
    dirs = []
    for directory in (root, os.path.join(root, LIB64), os.path.join(root, BIN)):
        try:
            here = os.lstat(directory)
            mode, owner = here.st_mode, here.st_uid
        except FileNotFoundError:
            dirs.append(directory)
            continue
        if not stat.S_ISDIR(mode) or stat.S_IMODE(mode) != 0o755 or owner != os.geteuid():
            dirs.append(directory)
    make = [entry for entry in wanted if not up_to_date(root, entry)]
    names = {entry.name for entry in wanted}
    remove = [name for name in present(root) if name not in names]
    version_path = os.path.join(root, VERSION_FILE)
    try:
        with open(version_path, encoding="utf-8") as handle:
            current = handle.read()
    except (FileNotFoundError, NotADirectoryError):
        current = None
    if current != f"{version}\n" or stat.S_IMODE(os.stat(version_path).st_mode) != 0o644:
        make.append(Entry(VERSION_FILE))
    return make, remove, dirs


def place(root: str, entry: Entry, version: str) -> None:
    """Make one entry under a temporary name and rename it into place."""
    path = os.path.join(root, entry.name)
    temp = os.path.join(os.path.dirname(path), TEMP_PREFIX + os.path.basename(path))
    if os.path.lexists(temp):
        os.unlink(temp)
    if entry.link:
        os.symlink(entry.link, temp)
    elif entry.source:
        try:
            os.link(entry.source, temp)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
            shutil.copy2(entry.source, temp)
    else:  # driver-version
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write(f"{version}\n")
        os.chmod(temp, 0o644)
    os.replace(temp, path)


def make_dir(directory: str) -> None:
    if os.path.islink(directory) or (os.path.lexists(directory) and not os.path.isdir(directory)):
        raise OSError(errno.ENOTDIR, "not a directory (refusing to replace it)", directory)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    os.chown(directory, os.geteuid(), os.getegid())  # root's, where the module runs as root
    os.chmod(directory, 0o755)  # noqa: S103 (the driver's files are for every user)


def apply(root: str, make: list[Entry], remove: list[str], dirs: list[str], version: str) -> None:
    """The new entries first, then the old ones away: a job starting meanwhile finds
    every library of one driver or the other, never neither."""
    for directory in dirs:
        make_dir(directory)
    for entry in make:
        place(root, entry, version)
    for name in remove:
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            raise OSError(errno.EISDIR, "a directory where only driver files belong", path)
        os.unlink(path)


def describe(entry: Entry, version: str) -> str:
    if entry.link:
        return f"{entry.name} -> {entry.link}"
    if entry.source:
        return f"{entry.name} = {entry.source}"
    return f"{entry.name}: {version}"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "libraries": {"type": "list", "elements": "str", "required": True},
            "lib_dirs": {"type": "list", "elements": "path", "required": True},
            "binaries": {"type": "list", "elements": "str", "default": []},
            "bin_dirs": {"type": "list", "elements": "path", "default": ["/usr/bin"]},
            "driver_version": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    params = module.params
    root = os.path.normpath(params["path"])
    if not os.path.isabs(root) or root == "/":
        module.fail_json(
            msg=f"path: expected an absolute directory below /, not {params['path']!r}"
        )
    ldconfig = module.get_bin_path("ldconfig", required=True)  # PATH, then the sbin dirs
    rc, out, err = module.run_command([ldconfig, "-p"])
    if rc != 0:
        module.fail_json(msg=f"ldconfig -p failed: {err.strip()}")
    libraries = wanted_libraries(ldconfig_entries(out), params["libraries"], params["lib_dirs"])
    binaries = wanted_binaries(params["binaries"], params["bin_dirs"])
    version = version_of(libraries, params["driver_version"].strip())
    if not any(os.path.basename(e.name).startswith("libcuda.so") for e in libraries):
        where = ", ".join(params["lib_dirs"])
        module.warn(
            f"nvidia_gpu_driver_dir: no libcuda in `ldconfig -p` under {where}: "
            "containers on this node get no CUDA driver"
        )
    make, remove, dirs = plan(root, libraries + binaries, version)
    changed = bool(make or remove or dirs)
    if changed and not module.check_mode:
        try:
            apply(root, make, remove, dirs, version)
        except OSError as exc:
            module.fail_json(msg=f"{exc.filename or root}: {exc.strerror}")
    lines = [f"+ {d}/" for d in dirs] + [f"- {name}" for name in remove]
    lines += [f"+ {describe(entry, version)}" for entry in make]
    module.exit_json(
        changed=changed,
        libraries=[os.path.basename(e.name) for e in libraries],
        binaries=[os.path.basename(e.name) for e in binaries],
        driver_version=version,
        diff={"prepared": "".join(f"{line}\n" for line in lines)} if changed else {},
    )


if __name__ == "__main__":
    main()
