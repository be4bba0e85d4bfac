"""ONNX Runtime session options for llmc: one process-wide intra-op thread pool.

A CPU engine runs one ORT session per segment (19 for Gemma 3 270M). With ORT's default of one
thread pool per session, every pool spins after its run and the pools starve each other and the
attention kernel on a 2-core host. ORT's environment is per process and its global pool can be
sized once; once it exists, every session in the process must use it, so every llmc session is
created through ``session_options``, which also turns ORT's memory pattern off (see there).
"""

from __future__ import annotations


def session_options(threads: int):
    """``onnxruntime.SessionOptions`` bound to the global pool (``threads`` intra-op threads; the
    size of the first call in a process wins)."""
    import onnxruntime as ort
    from onnxruntime.capi import _pybind_state

    try:
        _pybind_state.set_global_thread_pool_sizes(threads, 1)
    except Exception as e:  # raised as a plain Fail when the global pool exists already
        if "already been created" not in str(e):
            raise
    opts = ort.SessionOptions()
    opts.use_per_session_threads = False
    # Why no memory pattern: with one, every run takes its intermediate tensors from one block
    # that ORT's arena reserves outside its pool and hands back to the OS after the run, so each
    # run pays page faults on all of it again. Measured on Gemma 3 270M, a 2048-token prefill
    # step: 370k minor faults (1.5 GB zeroed) in every run, 7.4 s; without the pattern the
    # arena keeps the memory after the first run: 238 faults, 3.9 s (AMD EPYC, 2 cores).
    opts.enable_mem_pattern = False
    # Errors only: ORT's warnings (an initializer it drops, a node placed on the CPU) are noise
    # on every load of an engine that runs as built.
    opts.log_severity_level = 3
    return opts
