"""Predict from Python: the C predictor through the shared libmmguard (ctypes).

No second implementation: the arguments become a spec file that points at
the job's own files (``hf_config:``, ``trainer:``, ``deepspeed:``, as
``mmguard import`` reads them, docs/import.md), and libmmguard predicts it
exactly as ``mmguard predict SPEC --json`` does.

    mmguard.predict(hf_config="/models/Qwen2.5-VL-7B-Instruct", training_args=args,
                    world_size=8, set={"training.seq_len": 4096})

The library is ``$MMGUARD_LIB``, else ``libmmguard.so`` next to this package's
repository build (``build/libmmguard.so``), else the system's.
"""
import ctypes
import ctypes.util
import json
import os
import tempfile

_lib = None


def _candidates():
    env = os.environ.get("MMGUARD_LIB")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    for up in ("../../build", "../build", "../../../build"):
        yield os.path.normpath(os.path.join(here, up, "libmmguard.so"))
    found = ctypes.util.find_library("mmguard")
    if found:
        yield found


def load_library(path=None):
    """The ctypes handle of libmmguard (loaded once)."""
    global _lib
    if _lib is not None and path is None:
        return _lib
    errors = []
    for p in ([path] if path else _candidates()):
        try:
            lib = ctypes.CDLL(p)
        except OSError as e:
            errors.append("%s: %s" % (p, e))
            continue
        lib.mm_predict_file_json.restype = ctypes.c_void_p
        lib.mm_predict_file_json.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p),
                                             ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
        lib.mm_text_free.argtypes = [ctypes.c_void_p]
        lib.mm_text_free.restype = None
        if path is None:
            _lib = lib
        return lib
    raise OSError("mmguard: cannot load libmmguard (set MMGUARD_LIB; `make` builds "
                  "build/libmmguard.so): " + "; ".join(errors))


def predict_spec(spec_path, overrides=(), lib=None):
    """Predict a spec file with "dotted.key=value" overrides: the dict of
    ``mmguard predict SPEC --set ... --json``.  ValueError on bad input."""
    lib = lib or load_library()
    sets = [s.encode() for s in overrides]
    arr = (ctypes.c_char_p * max(1, len(sets)))(*sets)
    err = ctypes.create_string_buffer(1024)
    ptr = lib.mm_predict_file_json(os.fsencode(spec_path), arr, len(sets), err, len(err))
    if not ptr:
        raise ValueError("mmguard: " + err.value.decode(errors="replace"))
    try:
        return json.loads(ctypes.string_at(ptr).decode())
    finally:
        lib.mm_text_free(ptr)


def _changed_args(args):
    """TrainingArguments (or any dataclass with to_dict) as the keys that
    differ from the field defaults: what the user set.  (No default instance
    is built: a new TrainingArguments resets Accelerate's state.)"""
    import dataclasses
    import enum
    d = args.to_dict()
    if not dataclasses.is_dataclass(args):
        return d
    out = {}
    for f in dataclasses.fields(args):
        if f.name not in d or not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            base = f.default
        elif f.default_factory is not dataclasses.MISSING:
            base = f.default_factory()
        else:
            base = dataclasses.MISSING
        base = base.value if isinstance(base, enum.Enum) else base
        if base is dataclasses.MISSING or d[f.name] != base:
            out[f.name] = d[f.name]
    return out


def _as_file(value, d, name, transform=None):
    """A path stays a path; a dict (or config / arguments object) is written as JSON."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        return os.path.abspath(os.fspath(value))
    if hasattr(value, "to_dict") and not isinstance(value, dict):
        value = transform(value) if transform else value.to_dict()
    p = os.path.join(d, name)
    with open(p, "w") as f:
        json.dump(value, f, default=str)
    return p


def _scalar(v):
    return json.dumps(v) if not isinstance(v, str) else v


def predict(hf_config=None, training_args=None, world_size=None, deepspeed=None, spec=None,
            set=None, name="python"):
    """The prediction as a dict (the JSON of ``mmguard predict --json``).

    hf_config: a model directory / config.json path, a dict, or a
    PretrainedConfig; training_args: a TrainingArguments file path, a dict or
    a TrainingArguments (only the keys that differ from the defaults are
    passed); deepspeed: a path or a dict; world_size: the data-parallel
    degree; spec: an mmguard spec file instead (the others then override
    it); set: {"dotted.key": value} overrides."""
    overrides = ["%s=%s" % (k, _scalar(v)) for k, v in (set or {}).items()]
    if world_size:
        overrides.append("training.data_parallel=%d" % int(world_size))
    if spec is not None:
        if hf_config is not None or training_args is not None or deepspeed is not None:
            raise ValueError("mmguard.predict: give spec= alone, or hf_config/training_args/deepspeed")
        return predict_spec(os.fspath(spec), overrides)
    with tempfile.TemporaryDirectory(prefix="mmguard-") as d:
        lines = ["name: %s" % json.dumps(name)]
        for key, val, fname, tr in (("hf_config", hf_config, "config.json", None),
                                    ("trainer", training_args, "trainer.json", _changed_args),
                                    ("deepspeed", deepspeed, "ds_config.json", None)):
            p = _as_file(val, d, fname, tr)
            if p:
                lines.append("%s: %s" % (key, json.dumps(p)))
        path = os.path.join(d, "spec.yaml")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return predict_spec(path, overrides)
