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
