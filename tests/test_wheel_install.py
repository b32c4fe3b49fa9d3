"""A wheel built from the repository works outside it: templates, migrations, static files and
the dictionary travel inside the package, so `pip install .` (not only `-e`) gives a working tool.

The wheel goes into a scratch virtual environment whose only view of the dependencies is the
test environment's site-packages directory added as a plain path (its .pth files, among them
the editable install of this repository, are not run), and every command runs from a scratch
working directory, so nothing can be read from the repository by accident.
"""
from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    dist = work / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(dist), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    wheel = next(dist.glob("rlregistry-*.whl"))

    env_dir = work / "venv"
    venv.create(env_dir, with_pip=False)
    purelib = Path(subprocess.check_output(
        [str(env_dir / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    deps = [p for p in {*site.getsitepackages(), sysconfig.get_paths()["purelib"]} if Path(p).is_dir()]
    (purelib / "test_dependencies.pth").write_text("\n".join(deps) + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(purelib),
                              str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    return env_dir


def run_installed(env_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLREG_", "PYTHON"))}
    return subprocess.run([str(env_dir / "bin" / "python"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_installed_package_is_not_the_repository(installed: Path, tmp_path: Path) -> None:
    out = run_installed(installed, tmp_path, "-c", "import registry, config; print(registry.__file__, config.__file__)")
    assert out.returncode == 0, out.stderr
    assert str(ROOT) not in out.stdout
    assert str(installed) in out.stdout


def test_demo_registers_and_the_web_ui_renders_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    demo = run_installed(installed, tmp_path, "-m", "registry.cli", "demo", "--db", str(db), "--no-serve")
    assert demo.returncode == 0, demo.stderr
    assert db.exists()

    script = f"""
from registry.web.app import create_app
app = create_app({{"DATABASE_URL": "sqlite:///{db}", "TESTING": True, "SECRET_KEY": "x" * 32}})
client = app.test_client()
runs = client.get("/runs")
assert runs.status_code == 200, runs.status_code
page = runs.get_data(as_text=True)
assert "<table" in page
run_id = app.extensions["rlregistry"].list_runs(limit=1)[0][0]["id"]
dashboard = client.get("/runs/" + run_id)
assert dashboard.status_code == 200, dashboard.status_code
assert client.get("/static/style.css").status_code == 200
assert client.get("/dictionary/").status_code == 200
print("pages ok")
"""
    pages = run_installed(installed, tmp_path, "-c", script)
    assert pages.returncode == 0, pages.stderr
    assert "pages ok" in pages.stdout
