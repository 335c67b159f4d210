from __future__ import annotations

import pytest
import torch

from ddpipe.train.models import build_model


@pytest.mark.parametrize(("name", "params"), [("resnet18", 11_689_512), ("resnet50", 25_557_032)])
def test_standard_parameter_counts(name: str, params: int) -> None:
    model = build_model(name, 1000)
    assert sum(p.numel() for p in model.parameters()) == params  # torchvision's counts


def test_forward_shapes() -> None:
    x = torch.randn(2, 3, 64, 64)
    assert build_model("resnet18", 7)(x).shape == (2, 7)
    assert build_model("smallcnn", 5)(x).shape == (2, 5)
    with pytest.raises(ValueError, match="unknown model"):
        build_model("vgg")


def test_the_command_lines_help_names_every_model_and_no_other() -> None:
    """``ddpipe train --help`` and ``ddpipe bench --help`` list the models without loading torch: the
    list is written out apart from the models, and a model added to one and not the other would be
    hidden from users, or offered and refused."""
    from ddpipe.cli.arguments import MODEL_NAMES
    from ddpipe.train.models import MODELS

    assert tuple(MODELS) == MODEL_NAMES
