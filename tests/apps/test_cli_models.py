"""``glyd demo``, ``glyd fit`` and ``glyd eval`` (:mod:`glyd.apps.cli_models`): hostile arguments get one
line naming the argument, before any model is loaded."""

from __future__ import annotations

import pytest
import torch

from glyd.cli import main


@pytest.mark.parametrize("command", [["demo"], ["eval", "m"], ["serve", "m"]])
@pytest.mark.parametrize("device", ["bogus", "cuda:x", *([] if torch.cuda.is_available() else ["cuda"])])
def test_a_device_torch_cannot_use_is_an_argument_error(command, device, capsys):
    # it was a ValueError/RuntimeError traceback from the loader, after the command had started
    with pytest.raises(SystemExit) as info:
        main([*command, "--device", device])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"glyd {command[0]}: error: argument --device:") and repr(device) in err
