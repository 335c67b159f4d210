"""``ddpipe convert`` into a bucket under mpiexec whose last step, rank 0 sending ``index.json``, fails
as a lost connection would (tests/storage): the other ranks must not wait for it forever.

argv: SRC URL"""

from __future__ import annotations

import os
import sys

from ddpipe.cli import main
from ddpipe.manifest import MANIFEST_NAME
from ddpipe.storage import ObjectStorage, StorageError


def main_with_a_lost_manifest() -> None:
    real_put = ObjectStorage.put_bytes
    rank = int(os.environ["PMI_RANK"])  # mpiexec's (hydra's), read before ddpipe starts MPI

    def put_bytes(self: ObjectStorage, name: str, data: bytes) -> None:
        if rank == 0 and name == MANIFEST_NAME:
            raise StorageError("connection lost", path=self.url(name))
        real_put(self, name, data)

    ObjectStorage.put_bytes = put_bytes  # type: ignore[method-assign]
    sys.exit(main(["convert", sys.argv[1], sys.argv[2], "--samples-per-shard", "5", "--quiet"]))


if __name__ == "__main__":
    main_with_a_lost_manifest()
