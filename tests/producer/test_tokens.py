"""Writer tokens (what makes each claimed object's bytes its writer's own) stay unique
across processes, forked ones too."""

from __future__ import annotations

import os


def test_tokens_are_unique_in_forked_children() -> None:
    from txlog.model import new_token

    mine = {new_token() for _ in range(100)}
    assert len(mine) == 100
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, "\n".join(new_token() for _ in range(100)).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        theirs = set(f.read().decode().split("\n"))
    os.waitpid(pid, 0)
    assert len(theirs) == 100 and not (theirs & mine)
    assert not (theirs & {new_token() for _ in range(100)})
