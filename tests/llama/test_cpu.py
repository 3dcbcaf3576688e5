"""llama.cpp on the CPU: where a loaded model's weights live (never in llama.cpp's AMX buffer, whose
matmul crashes on common cloud hosts, unless KVCHAT_CPU_WEIGHTS=extra opts in, on any machine),
and how its threads wait and how many there are.

Whether this machine's build has an AMX buffer type at all depends on its CPU (`grep -c amx_int8
/proc/cpuinfo`): so the tests check both what kvchat asks llama.cpp for, which holds everywhere,
and the buffers llama.cpp reports having put the weights in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvchat.errors import SettingsError
from kvchat.llama import ContextSettings, LlamaModel, available_cpus, extra_buffer_types, system_info, weight_layout
from kvchat.llama._lib import raw
from kvchat.llama.cpu import WEIGHTS_ENV, apply_weight_layout, weight_buffers


@pytest.mark.parametrize(("layout", "extra_bufts"), [("plain", False), ("extra", True)])
def test_kvchat_asks_for_extra_buffer_types_only_when_opted_in(layout, extra_bufts) -> None:
    params = raw.llama_model_default_params()
    assert params.use_extra_bufts  # llama.cpp's own default: AMX first where the build has it
    apply_weight_layout(params, layout)
    assert params.use_extra_bufts is extra_bufts


def test_the_layout_is_plain_unless_the_environment_names_another(monkeypatch) -> None:
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    assert weight_layout() == "plain"
    monkeypatch.setenv(WEIGHTS_ENV, " Extra ")
    assert weight_layout() == "extra"
    monkeypatch.setenv(WEIGHTS_ENV, "amx")
    with pytest.raises(SettingsError, match="'amx' is not a CPU weight layout") as error:
        weight_layout()
    assert error.value.hint == "use one of plain, extra, or unset it"


def test_a_model_loads_into_the_plain_cpu_buffer_by_default(tiny_model_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    with LlamaModel(tiny_model_path) as model:
        assert model.weight_layout == "plain"
        assert set(model.weight_buffers) == {"CPU_Mapped"}
        assert model.weight_buffers["CPU_Mapped"] > 0


def test_the_load_log_names_every_weight_buffer_with_its_size() -> None:
    lines = [
        "load_tensors: loading model tensors, this can take a while... (mmap = true)",
        "load_tensors:          AMX model buffer size =   576.00 MiB",
        "load_tensors:   CPU_Mapped model buffer size =  1059.89 MiB",
        "load_tensors:   CPU_REPACK model buffer size =    20.25 MiB",
    ]
    assert weight_buffers(lines) == {"AMX": 576.0, "CPU_Mapped": 1059.89, "CPU_REPACK": 20.25}


def test_the_build_reports_its_cpu_features_and_extra_buffer_types() -> None:
    """Each backend's features after its name; a GPU build's backend comes first ("CUDA : …")."""
    assert system_info().startswith("CPU :") or " | CPU : " in system_info()
    offered = extra_buffer_types()
    assert set(offered) <= {"AMX", "CPU_REPACK", "CPU_KLEIDIAI", "CPU_RISCV64_SPACEMIT"}
    assert ("REPACK = 1" in system_info()) == ("CPU_REPACK" in offered)


@pytest.mark.real_model
def test_a_quantized_model_never_gets_amx_and_gets_repack_only_when_opted_in(small_model_path: Path, monkeypatch) -> None:
    """The small model's Q4_K/Q6_K weights are the ones llama.cpp puts in AMX or CPU_REPACK."""
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    with LlamaModel(small_model_path) as model:
        assert set(model.weight_buffers) == {"CPU_Mapped"}
    if "CPU_REPACK" not in extra_buffer_types() or "AMX" in extra_buffer_types():
        pytest.skip("this build repacks no weights, or opting in would bring AMX (experimental) here")
    monkeypatch.setenv(WEIGHTS_ENV, "extra")
    with LlamaModel(small_model_path) as model:
        assert "CPU_REPACK" in model.weight_buffers and "AMX" not in model.weight_buffers


def _spin_count_after_import(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = "import os, kvchat.llama; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
    return subprocess.run([sys.executable, "-c", code], env={**environment, **env}, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.system
def test_openmp_threads_spin_briefly_before_they_sleep_unless_the_user_said_otherwise() -> None:
    assert _spin_count_after_import() == "3000 None"
    assert _spin_count_after_import(GOMP_SPINCOUNT="300000") == "300000 None"
    assert _spin_count_after_import(OMP_WAIT_POLICY="active") == "None active"


@pytest.mark.system
def test_threads_default_to_the_cpus_this_process_may_use_for_reading_and_decoding() -> None:
    assert available_cpus() == len(os.sched_getaffinity(0))
    settings = ContextSettings(n_ctx=64)
    assert (settings.batch_thread_count(), settings.thread_count()) == (available_cpus(), available_cpus())
    assert (ContextSettings(n_ctx=64, threads=1).batch_thread_count(), ContextSettings(n_ctx=64, threads_batch=3).thread_count()) == (1, available_cpus())
    shrunk = "import os; os.sched_setaffinity(0, {0}); from kvchat.llama import available_cpus; print(available_cpus())"
    assert subprocess.run([sys.executable, "-c", shrunk], capture_output=True, text=True, check=True).stdout.strip() == "1"
