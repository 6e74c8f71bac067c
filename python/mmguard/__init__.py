"""mmguard's job-side recorder (docs/outcome.md).

    import mmguard
    with mmguard.recording(model, optimizer):      # plain torch / Accelerate
        train()
    rec = mmguard.Recorder().watch(model, optimizer).install_exit_hooks()
    from mmguard.hf import MmguardCallback        # HF Trainer
    mmguard.predict(hf_config=..., training_args=..., world_size=8)   # libmmguard
"""
from .predict import load_library, predict, predict_spec
from .recorder import FORMAT_VERSION, Recorder, host_peak_rss, is_oom, recording

__all__ = ["FORMAT_VERSION", "Recorder", "host_peak_rss", "is_oom", "recording",
           "predict", "predict_spec", "load_library"]
__version__ = "0.1.0"
