"""Checks one built syncmgr wheel without installing it; prints one line.

    check_wheel.py --arch x86_64 --python 3.11 --glibc 2.17 [--auditwheel PATH] WHEEL

* the name carries cpXY-cpXY-manylinux_<glibc>_<arch> (and the manylinux2014
  alias for 2.17);
* ``auditwheel show`` finds the wheel consistent with that manylinux tag
  (its most compatible tag is that glibc's or an older one's: no symbol
  newer than that glibc, no library outside the manylinux set);
* the wheel holds syncmgr._fastpath for this CPython and architecture (an
  ELF for that machine, needing nothing but libc);
* the daemon, syncmgr/_bin/syncmgr, is a static ELF for that architecture
  and executable.

Exit status 1, with the reason, when any of these fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import zipfile

ELF_MACHINE = {"x86_64": 62, "aarch64": 183}


def elf_info(data: bytes) -> tuple[int, list[int]]:
    """(e_machine, program header types) of a 64-bit little-endian ELF."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF")
    (machine,) = struct.unpack_from("<H", data, 0x12)
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    types = [struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)]
    return machine, types


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", required=True, choices=sorted(ELF_MACHINE))
    ap.add_argument("--python", required=True, help="3.X")
    ap.add_argument("--glibc", default="2.17")
    ap.add_argument("--auditwheel", default="auditwheel")
    ap.add_argument("wheel")
    a = ap.parse_args()
    name = os.path.basename(a.wheel)
    xy = a.python.replace(".", "")
    gmaj, gmin = a.glibc.split(".")
    plat = f"manylinux_{gmaj}_{gmin}_{a.arch}"
    want_tag = f"cp{xy}-cp{xy}-{plat}" + (f".manylinux2014_{a.arch}" if a.glibc == "2.17" else "")
    problems: list[str] = []
    if not name.endswith(f"-{want_tag}.whl"):
        problems.append(f"name {name} does not end in -{want_tag}.whl")

    aw = subprocess.run([a.auditwheel, "show", "--json", a.wheel], capture_output=True, text=True)
    seen = "?"
    if aw.returncode != 0:
        problems.append(f"auditwheel show failed: {(aw.stderr or aw.stdout).strip()[-400:]}")
    else:
        report = json.loads(aw.stdout)
        seen = _auditwheel_tag(report, a.arch)
        need = re.fullmatch(rf"manylinux_(\d+)_(\d+)_{a.arch}", seen)
        # Consistent with an older glibc's tag is consistent with ours too.
        if not need or (int(need[1]), int(need[2])) > (int(gmaj), int(gmin)):
            problems.append(f"auditwheel finds the wheel consistent with {seen}, the name claims {plat}")

    z = zipfile.ZipFile(a.wheel)
    ext_name = f"syncmgr/_fastpath.cpython-{xy}-{a.arch}-linux-gnu.so"
    sos = [n for n in z.namelist() if n.endswith(".so")]
    ext_kib = 0
    if sos != [ext_name]:
        problems.append(f"extension modules {sos}, want [{ext_name}]")
    else:
        data = z.read(ext_name)
        ext_kib = len(data) // 1024
        machine, _ = elf_info(data)
        if machine != ELF_MACHINE[a.arch]:
            problems.append(f"{ext_name}: ELF machine {machine}, want {ELF_MACHINE[a.arch]} ({a.arch})")

    info = z.getinfo("syncmgr/_bin/syncmgr")
    daemon = z.read(info)
    machine, types = elf_info(daemon)
    if not (info.external_attr >> 16) & 0o111:
        problems.append("the daemon is not executable in the wheel")
    if machine != ELF_MACHINE[a.arch]:
        problems.append(f"daemon: ELF machine {machine}, want {ELF_MACHINE[a.arch]} ({a.arch})")
    if 2 in types or 3 in types:
        problems.append(f"daemon is dynamically linked (program header types {types})")

    if problems:
        print("\n".join(problems))
        return 1
    print(f"auditwheel: {seen}; _fastpath for cp{xy} {a.arch} ({ext_kib} KiB); "
          f"daemon: static {a.arch} ELF ({len(daemon) // 1024} KiB)")
    return 0


def _auditwheel_tag(report: dict, arch: str) -> str:
    """The most compatible manylinux tag auditwheel finds the wheel
    consistent with: its JSON's overall_tag (auditwheel >= 6.2)."""
    tag = report.get("overall_tag")
    if isinstance(tag, str):
        return tag
    m = re.findall(rf"manylinux_\d+_\d+_{arch}", json.dumps(report))
    return min(m, key=lambda t: tuple(map(int, t.split("_")[1:3]))) if m else "none"


if __name__ == "__main__":
    sys.exit(main())
