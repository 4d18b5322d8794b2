"""The demo's server-less broker, made safe for concurrent publishing.

kombu's ``filesystem://`` transport writes a message file in place. A worker that polls
the folder can take a file that its producer has created but not yet written, read it
empty, and stop on a ``JSONDecodeError`` (seen when the demo publishes 24 messages from
as many threads while the worker consumes). Here each message is written under a name
the worker skips, then renamed into place: a rename on one file system is atomic, so a
worker only ever sees whole messages. Imported by ``proj.celery`` for that broker only.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


def _put(self: Any, queue: str, payload: Any, **kwargs: Any) -> None:
    name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
    final = os.path.join(self.data_folder_out, name)
    partial = final + ".part"  # not "<queue>.msg": the worker's _get skips it
    with open(partial, "wb") as fh:
        fh.write(str_to_bytes(dumps(payload)))
    os.replace(partial, final)


filesystem.Channel._put = _put
