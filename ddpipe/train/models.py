"""Models in plain PyTorch (torchvision has no CPU build here): the ResNet family with the standard
architectures (He et al., 2016; torchvision's layout and parameter counts) and a small CNN for fast
CPU runs."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..errors import OptionError


def _conv3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv3(cin, width, stride), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv3(width, width), nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv3(width, width, stride), nn.BatchNorm2d(width)  # stride here, as v1.5
        self.conv3, self.bn3 = nn.Conv2d(width, width * 4, 1, bias=False), nn.BatchNorm2d(width * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], num_classes: int = 1000) -> None:
        super().__init__()
        self.cin = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._layer(block, 64, layers[0])
        self.layer2 = self._layer(block, 128, layers[1], stride=2)
        self.layer3 = self._layer(block, 256, layers[2], stride=2)
        self.layer4 = self._layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _layer(self, block: type[BasicBlock] | type[Bottleneck], width: int, blocks: int,
               stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.cin != width * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.cin, width * block.expansion, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(width * block.expansion))
        layers: list[nn.Module] = [block(self.cin, width, stride, downsample)]
        self.cin = width * block.expansion
        layers += [block(self.cin, width) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class SmallCNN(nn.Module):
    """A few convolutions for fast CPU runs and tests (optionally without batch norm, whose per-rank
    statistics make data-parallel training differ from one process)."""

    def __init__(self, num_classes: int = 10, batch_norm: bool = True) -> None:
        super().__init__()

        def norm(c: int) -> nn.Module:
            return nn.BatchNorm2d(c) if batch_norm else nn.Identity()

        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), norm(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), norm(32), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), norm(64), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


MODELS: dict[str, Callable[[int], nn.Module]] = {
    "resnet18": lambda n: ResNet(BasicBlock, [2, 2, 2, 2], n),
    "resnet34": lambda n: ResNet(BasicBlock, [3, 4, 6, 3], n),
    "resnet50": lambda n: ResNet(Bottleneck, [3, 4, 6, 3], n),
    "resnet101": lambda n: ResNet(Bottleneck, [3, 4, 23, 3], n),
    "smallcnn": lambda n: SmallCNN(n),
}


def build_model(name: str, num_classes: int = 1000) -> nn.Module:
    try:
        return MODELS[name](num_classes)
    except KeyError:
        raise OptionError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}") from None
