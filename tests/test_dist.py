"""The other product named ``glyd`` in the registry: found beside the package, and said once."""

from __future__ import annotations

import warnings

import pytest

from glyd._dist import DIST_NAME, SUMMARY_PREFIX, conflicts, warn_conflicts


def _dist_info(site, name, version, summary):
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
                                   f"Summary: {summary}\n\nbody\n")


def test_the_other_product_is_found(tmp_path):
    _dist_info(tmp_path, "glyd", "0.32.1", "Lossless AI compression: 33% less GPU memory, bit for bit.")
    _dist_info(tmp_path, "glyd_gpu", "0.32.1", "Glyd on the GPU")
    _dist_info(tmp_path, "glyd_lossless", "0.1.0", SUMMARY_PREFIX + " (about 11 bits a weight)")
    assert conflicts(tmp_path) == ["glyd 0.32.1", "glyd-gpu 0.32.1"]
    with pytest.warns(RuntimeWarning, match=r"also has glyd 0\.32\.1, glyd-gpu 0\.32\.1 installed: a different "
                                            r"product .*\(pip uninstall glyd glyd-gpu, or pip uninstall glyd-lossless"):
        warn_conflicts(tmp_path)


def test_this_project_under_its_earlier_name_is_not_a_conflict(tmp_path):
    _dist_info(tmp_path, "glyd", "0.1.0", SUMMARY_PREFIX + " (about 11 bits a weight) with GPU kernels")
    assert conflicts(tmp_path) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_conflicts(tmp_path)


def test_the_distribution_name_is_this_projects():
    tomllib = pytest.importorskip("tomllib")
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == DIST_NAME
    assert pyproject["project"]["description"].startswith(SUMMARY_PREFIX)
    assert {"glyd", DIST_NAME} <= set(pyproject["project"]["scripts"])
