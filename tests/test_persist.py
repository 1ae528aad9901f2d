"""Saving and loading fitted ensembles: the round trip gives the same predictions; files of another format
version, another kind or no bootens file at all give one clear error."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from sklearn.datasets import make_blobs

from bootens_core import persist
from bootens_core.estimators import BootstrapEnsembleClassifier, BootstrapEnsembleRegressor, load

_SMALL = {"hidden_layer_sizes": (6, 5), "n_particles": 3, "steps": 50, "optimizer": "adam", "learning_rate": 0.05}


def _regression():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2))
    return x, 3.0 + np.sin(x[:, 0]) + 0.1 * rng.normal(size=40)


@pytest.fixture(scope="module")
def regressor() -> tuple[BootstrapEnsembleRegressor, np.ndarray]:
    x, y = _regression()
    return BootstrapEnsembleRegressor(**_SMALL, noise_grid=(0.01, 0.1), random_state=np.int64(2)).fit(x, y), x


def test_regressor_round_trip(regressor, tmp_path):
    est, x = regressor
    path = est.save(tmp_path / "reg.npz")
    again = BootstrapEnsembleRegressor.load(path)
    assert again.get_params() == est.get_params()
    for method in ("predict_particles", "predict_quantiles"):
        np.testing.assert_array_equal(getattr(again, method)(x), getattr(est, method)(x))
    np.testing.assert_array_equal(again.predict(x, return_std=True), est.predict(x, return_std=True))
    for attr in ("noise_var_", "noise_var_standardised_", "y_mean_", "y_scale_", "n_particles_",
                 "n_features_in_"):
        assert getattr(again, attr) == getattr(est, attr), attr
    for attr in ("validation_mnll_", "diverged_", "loss_curve_", "x_mean_", "x_scale_"):
        np.testing.assert_array_equal(getattr(again, attr), getattr(est, attr), err_msg=attr)
    assert type(load(path)) is BootstrapEnsembleRegressor
    assert [p.name for p in tmp_path.iterdir()] == ["reg.npz"]  # written atomically: no temporary left


@pytest.mark.parametrize("labels", [None, ["no", "yes", "maybe"], [-1, 7, 3]])
def test_classifier_round_trip(labels, tmp_path):
    x, codes = make_blobs(60, centers=3, random_state=0)
    y = codes if labels is None else np.asarray(labels)[codes]
    clf = BootstrapEnsembleClassifier(**_SMALL, random_state=0).fit(x, y)
    again = load(clf.save(tmp_path / "clf.npz"))
    assert type(again) is BootstrapEnsembleClassifier
    np.testing.assert_array_equal(again.classes_, clf.classes_)
    assert again.classes_.dtype == clf.classes_.dtype
    np.testing.assert_array_equal(again.predict_proba(x), clf.predict_proba(x))
    np.testing.assert_array_equal(again.predict(x), clf.predict(x))


def test_a_refit_after_loading_is_the_same_ensemble(regressor, tmp_path):
    est, x = regressor
    again = BootstrapEnsembleRegressor.load(est.save(tmp_path / "reg.npz"))
    y = _regression()[1]
    np.testing.assert_array_equal(again.fit(x, y).predict(x), est.predict(x))


def _rewrite_header(src, dst, **changes):
    with np.load(src) as npz:
        arrays = {k: npz[k] for k in npz.files}
    header = json.loads(str(arrays["__header__"][()]))
    header.update(changes)
    arrays["__header__"] = np.array(json.dumps(header))
    np.savez(dst, **arrays)


def test_newer_format_version_is_refused(regressor, tmp_path):
    est, _ = regressor
    path = est.save(tmp_path / "reg.npz")
    _rewrite_header(path, tmp_path / "new.npz", format_version=persist.FORMAT_VERSION + 1)
    newer = f"format version {persist.FORMAT_VERSION + 1}.*newer"
    with pytest.raises(persist.IncompatibleFileError, match=newer):
        BootstrapEnsembleRegressor.load(tmp_path / "new.npz")
    _rewrite_header(path, tmp_path / "other.npz", format="someone-else")
    with pytest.raises(persist.IncompatibleFileError, match="not a bootens ensemble"):
        load(tmp_path / "other.npz")


def test_other_files_are_refused(regressor, tmp_path):
    est, _ = regressor
    path = est.save(tmp_path / "reg.npz")
    with pytest.raises(persist.IncompatibleFileError, match="holds a BootstrapEnsembleRegressor, not a "):
        BootstrapEnsembleClassifier.load(path)
    np.savez(tmp_path / "plain.npz", a=np.zeros(3))
    with pytest.raises(persist.IncompatibleFileError, match="no header"):
        load(tmp_path / "plain.npz")
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(persist.IncompatibleFileError, match="not a bootens ensemble") as err:
        load(tmp_path / "text.npz")
    # one message of ours naming the path, not numpy's hint to allow pickles
    assert "text.npz" in str(err.value) and "pickle" not in str(err.value)
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(persist.IncompatibleFileError, match="empty.npz is empty"):
        load(tmp_path / "empty.npz")
    (tmp_path / "pickled.npz").write_bytes(b"\x80\x04K\x01.")  # a pickle, as np.save of an object writes
    with pytest.raises(persist.IncompatibleFileError, match="not a NumPy .npz archive") as err:
        load(tmp_path / "pickled.npz")
    assert "allow_pickle" not in str(err.value)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.npz")
    with zipfile.ZipFile(path) as z, zipfile.ZipFile(tmp_path / "cut.npz", "w") as out:
        for name in z.namelist():
            if not name.startswith("particles/1"):
                out.writestr(name, z.read(name))
    with pytest.raises(persist.IncompatibleFileError, match="incomplete"):
        load(tmp_path / "cut.npz")


@pytest.mark.parametrize(("setting", "value", "match"), [
    ("n_particles", -3, "n_particles must be an integer"),
    ("activation", "swish", "activation must be one of"),
    ("noise_grid", [], "noise_grid must be a non-empty sequence"),
    ("no_such_setting", 1, "do not fit BootstrapEnsembleRegressor"),
])
def test_a_setting_edited_into_the_file_is_refused_by_name(regressor, tmp_path, setting, value, match):
    est, _ = regressor
    path = est.save(tmp_path / "reg.npz")
    with np.load(path) as npz:
        header = json.loads(str(npz["__header__"][()]))
    config = dict(header["config"], **{setting: value})
    _rewrite_header(path, tmp_path / "edited.npz", config=config)
    with pytest.raises(persist.IncompatibleFileError, match=match) as err:
        load(tmp_path / "edited.npz")
    assert "edited.npz" in str(err.value)


def test_column_names_survive_saving(tmp_path):
    pd = pytest.importorskip("pandas")
    x, y = _regression()
    frame = pd.DataFrame(x, columns=["age", "dose"])
    est = BootstrapEnsembleRegressor(**_SMALL, noise_var=0.1, random_state=0).fit(frame, y)
    again = load(est.save(tmp_path / "reg.npz"))
    np.testing.assert_array_equal(again.feature_names_in_, ["age", "dose"])
    assert again.feature_names_in_.dtype == object
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # before: "X has feature names, but ... was fitted without"
        np.testing.assert_array_equal(again.predict(frame), est.predict(frame))
    with pytest.raises(ValueError, match="feature names"):
        again.predict(frame.rename(columns={"dose": "weight"}))
    plain = load(BootstrapEnsembleRegressor(**_SMALL, noise_var=0.1).fit(x, y).save(tmp_path / "plain.npz"))
    assert not hasattr(plain, "feature_names_in_")


def test_write_checks_what_it_writes(tmp_path):
    with pytest.raises(TypeError, match="JSON"):
        persist.write(tmp_path / "a.npz", "x", {"f": object()}, {}, {})
    with pytest.raises(TypeError, match="dtype"):
        persist.write(tmp_path / "a.npz", "x", {}, {}, {"s": np.array(["a"])})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        persist.write(tmp_path / "no" / "a.npz", "x", {}, {}, {})
    path = persist.write(tmp_path / "a.npz", "thing", {"n": 1}, {"m": [1, 2]}, {"v": np.arange(3)})
    saved = persist.read(path)
    assert (saved.kind, saved.config, saved.fitted) == ("thing", {"n": 1}, {"m": [1, 2]})
    assert saved.format_version == persist.FORMAT_VERSION
    np.testing.assert_array_equal(saved.arrays["v"], np.arange(3))
    assert set(saved.versions) == {"bootens", "jax", "numpy", "python"}
