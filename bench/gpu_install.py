"""Make this machine's Python able to run Trainbook's GPU tier: an overlay environment with the wheels it lacks.

    python bench/gpu_install.py --venv DIR --json FILE [--wheels .whl] [--list bench/gpu_wheels.txt]

The overlay is a venv at DIR that sees every package of the Python running this script (a .pth file adds its site
directories after the overlay's own), so nothing of the image is changed or shadowed, torch above all; the
distributions bench/gpu_wheels.txt names that this Python lacks are installed into it from the wheels folder,
offline. A missing wheels folder or wheel is reported, not fatal: what needs it fails or skips later, with a
reason. Then Trainbook itself goes in as an editable install (its `trainbook` command and version), when absent.
Writes what it found and did to FILE (JSON); exit status 0 unless the overlay could not be made.
"""

from __future__ import annotations

import argparse
import json
import re
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PIP = ["-m", "pip", "--disable-pip-version-check", "--no-input"]


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wanted(list_file: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in list_file.read_text().splitlines())
    return [normalise(line.split()[0]) for line in lines if line]


def wheel_files(folder: Path) -> dict[str, Path]:
    """Distribution name -> wheel file (a wheel's name starts with its distribution, '-' spelt '_')."""
    return {normalise(f.name.split("-", 1)[0]): f for f in sorted(folder.glob("*.whl"))} if folder.is_dir() else {}


def make_overlay(folder: Path) -> tuple[Path, Path]:
    """A venv without pip of its own (the base's pip runs in it and installs into it) whose site directory ends by
    adding this Python's site directories: site.addsitedir, so their own .pth files (editable installs) apply.
    Returns its python and its site-packages."""
    venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(folder)
    python = folder / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    bases = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user and Path(user).is_dir() and user not in bases:
        bases.append(user)
    Path(purelib, "_trainbook_base.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in bases))
    return python, Path(purelib)


def has_pip(python: Path) -> bool:
    """pip runs in the overlay: the base's, or else one ensurepip installs offline from CPython's own bundled wheel."""
    def works():
        return subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0

    if works():
        return True
    subprocess.run([python, "-m", "ensurepip", "--default-pip"], capture_output=True, timeout=60)
    return works()


def unzip_install(site_packages: Path, bindir: Path, wheels: list[Path]) -> None:
    """Without any pip: a wheel is a zip of what goes into site-packages, plus NAME.data/{purelib,platlib,scripts}.
    Enough to import it (and for ninja's binary, which keeps its mode); no console scripts are made, and none is
    needed (the DeepSpeed launcher runs as `python -m deepspeed.launcher.runner`)."""
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.infolist():
                parts = member.filename.split("/")
                if member.is_dir():
                    continue
                script = parts[0].endswith(".data") and parts[1:2] == ["scripts"]
                if parts[0].endswith(".data"):
                    if len(parts) < 3 or parts[1] not in ("purelib", "platlib", "scripts"):
                        continue  # headers, data: nothing an import needs
                    target = (bindir if parts[1] == "scripts" else site_packages).joinpath(*parts[2:])
                else:
                    target = site_packages.joinpath(*parts)
                data = archive.read(member)
                if script and data.startswith(b"#!python"):  # the placeholder installers replace with the interpreter
                    data = b"#!" + str(bindir / "python").encode() + data[len(b"#!python"):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                mode = member.external_attr >> 16
                if mode & 0o111 or script:
                    target.chmod(0o755)


def versions(python: Path, names: list[str]) -> dict[str, str | None]:
    """Installed version of each distribution as `python` sees it (None: absent)."""
    code = ("import json, sys, importlib.metadata as m\n"
            "def v(n):\n"
            "    try: return m.version(n)\n"
            "    except m.PackageNotFoundError: return None\n"
            "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    # from /: a trainbook.egg-info in the current folder would read as installed
    return json.loads(subprocess.run([python, "-c", code, *names], capture_output=True, text=True, check=True,
                                     cwd="/").stdout)


def pip(python: Path, args: list[str], timeout: float) -> dict:
    """Run pip in the overlay; its last lines kept for the report."""
    command = [str(python), *PIP, *args]
    print("+ pip", " ".join(args), flush=True)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        rc, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = 124, f"timed out after {timeout:.0f} s\n{exc.stdout or ''}{exc.stderr or ''}"
    lines = [line for line in text.splitlines() if "is ignored: it is neither" not in line]
    print("\n".join(lines[-15:]), flush=True)
    return {"args": args, "rc": rc, "tail": "\n".join(lines[-15:])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, required=True, help="where to make the overlay environment")
    parser.add_argument("--json", type=Path, required=True, help="where to write what was found and done")
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl")
    parser.add_argument("--list", type=Path, default=REPO / "bench" / "gpu_wheels.txt")
    args = parser.parse_args()

    report: dict = {"base_python": sys.executable, "wheels_dir": str(args.wheels),
                    "wheels_dir_found": args.wheels.is_dir(), "present": {}, "installed": {}, "missing": {},
                    "pip": [], "pip_check": [], "notes": []}
    try:
        python, site_packages = make_overlay(args.venv)
    except (OSError, subprocess.CalledProcessError) as exc:
        report["notes"].append(f"could not make the overlay environment: {exc}; running on the base Python, "
                               "nothing installed")
        args.json.write_text(json.dumps(report, indent=1))
        print(report["notes"][-1], file=sys.stderr)
        return 1
    report["python"] = str(python)

    names = wanted(args.list)
    wheels = wheel_files(args.wheels)
    before = versions(python, names)
    report["present"] = {n: v for n, v in before.items() if v}
    absent = [n for n, v in before.items() if not v]
    installable = [n for n in absent if n in wheels]
    if not args.wheels.is_dir():
        report["notes"].append(f"no wheels folder {args.wheels}: run `make gpu-wheels` where PyPI is reachable, and "
                               "carry the folder")
    for name in absent:
        if name not in wheels:
            report["missing"][name] = ("no wheels folder" if not args.wheels.is_dir()
                                       else f"no wheel for it in {args.wheels} (run `make gpu-wheels` again)")

    pip_works = has_pip(python)
    if installable and not pip_works:
        report["notes"].append("no pip for this Python, not even from ensurepip: the wheels were unpacked into the "
                               "overlay (importable; no console scripts)")
        unzip_install(site_packages, python.parent, [wheels[n] for n in installable])
    elif installable:
        # With dependencies first: pip then also upgrades, inside the overlay, a dependency the image has too old a
        # version of (typing-extensions for pydantic-core). One it cannot find anywhere (offline) fails the whole
        # command, so then install the same wheels alone and let the report name what is still unmet.
        step = pip(python, ["install", "--no-index", "--find-links", str(args.wheels), *installable], timeout=60)
        report["pip"].append(step)
        if step["rc"] != 0:
            report["notes"].append("pip could not resolve the carried wheels with their dependencies offline "
                                   "(see pip_check for what is unmet); installed them without dependencies")
            step = pip(python, ["install", "--no-index", "--no-deps", *(str(wheels[n]) for n in installable)],
                       timeout=60)
            report["pip"].append(step)
            if step["rc"] != 0:  # pip installs all or nothing: one wheel it refuses (another Python's) blocks the rest
                report["pip"] += [pip(python, ["install", "--no-index", "--no-deps", str(wheels[n])], timeout=30)
                                  for n in installable]

    if pip_works and not versions(python, ["trainbook"])["trainbook"]:
        # Editable: the tree that travelled is what runs. Offline and against the image's setuptools.
        step = pip(python, ["install", "--no-index", "--no-deps", "--no-build-isolation", "-e", str(REPO)],
                   timeout=60)
        report["pip"].append(step)
        if step["rc"] != 0:
            report["notes"].append("Trainbook could not be installed (editable); it runs from the tree through "
                                   "PYTHONPATH, without its `trainbook` command")

    after = versions(python, [*names, "trainbook"])
    report["installed"] = {n: after[n] for n in absent if after[n]}
    for name in absent:
        if not after[name] and name not in report["missing"]:
            report["missing"][name] = "its wheel did not install (see pip)"
    report["trainbook"] = after["trainbook"]

    # What the carried packages still need and nothing provides (here, without torch: `deepspeed requires torch`).
    check = subprocess.run([python, *PIP, "check"], capture_output=True, text=True) if pip_works else None
    carried = set(names) | {"trainbook"}
    report["pip_check"] = [line for line in (check.stdout if check else "").splitlines()
                           if line.split() and normalise(line.split()[0]) in carried]

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"packages: {len(report['present'])} present, {len(report['installed'])} installed, "
          f"{len(report['missing'])} missing{': ' + ', '.join(report['missing']) if report['missing'] else ''}")
    for line in report["pip_check"]:
        print("unmet:", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
