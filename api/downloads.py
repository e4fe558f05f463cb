"""A submission's lists to download: its restored files with where they are, its failures with
their reasons; as CSV or as text (tab-separated, one file a line), written as they are read."""
import csv
import io

from carousel.domain.selectors import submissions as sub
from carousel.models import RequestState


def restored_rows(bulk, fmt):
    """The restored files: path, where (delivered to, on disk at, used in place at), pinned until."""
    if fmt == "csv":
        yield ["path", "where", "where_kind", "pin_until", "finished_at", "size"]
    for row in sub.bulk_files(bulk, [RequestState.DONE], sub.RESTORED_COLUMNS):
        kind, place = sub.restored_where(path=row["path"], staged_path=row["staged_path"],
                                         destination=row["destination"],
                                         destination_layout=row["destination_layout"],
                                         delivery_fs=row["delivery_fs"])
        pinned = row["pin_until"].isoformat() if row["pin_until"] else ""
        if fmt == "csv":
            yield [row["path"], place, kind, pinned, row["finished_at"].isoformat(), row["size"]]
        else:
            yield [row["path"], sub.where_text(kind, place)] + ([f"pinned until {pinned}"] if pinned else [])


def failed_rows(bulk, fmt):
    """The files that did not come back: failed (with the stager's reason), cancelled, expired."""
    if fmt == "csv":
        yield ["path", "state", "error_class", "reason", "attempts", "finished_at"]
    unfinished = [RequestState.FAILED, RequestState.CANCELLED, RequestState.EXPIRED]
    for row in sub.bulk_files(bulk, unfinished, sub.FAILED_COLUMNS):
        reason = row["last_error"] or row["state"]
        if fmt == "csv":
            yield [row["path"], row["state"], row["error_class"], reason, row["attempts"],
                   row["finished_at"].isoformat()]
        else:
            yield [row["path"], f"{row['state']}: {reason}"]


def stream(rows, fmt):
    """Each row as a CSV line, or as text (tab-separated, one file a line), written as it is read."""
    buffer = io.StringIO()
    writer = csv.writer(buffer) if fmt == "csv" else None
    for row in rows:
        if writer:
            writer.writerow(row)
        else:
            buffer.write("\t".join(str(v).replace("\n", " ") for v in row) + "\n")
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
