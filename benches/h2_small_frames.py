"""HTTP/2 DATA frames of 257 bytes, each followed by a 16 KB frame of an
unknown type that the server throws away: what do they make it hold?
(RELIABILITY.md, "Hostile callers".) h2 keeps a DATA frame as a slice of the
read buffer it arrived in, so each kept frame can keep a whole buffer alive.

    python3 benches/h2_small_frames.py PORT CA_PEM admitted MB
        one stream, admitted, whose 8 MB body arrives as MB megabytes of
        such frames and is then held for 3 s
    python3 benches/h2_small_frames.py PORT CA_PEM waiting N [big]
        four streams that take the body budget and send nothing, then N
        connections of one stream each that waits for room, with a window's
        worth (65,535 bytes) of such frames (or, with `big`, of 16 KB
        frames), held for 20 s

Start the server with `statusguard serve --write-ca CA_PEM --listen
127.0.0.1:PORT` and read its peak RSS (VmHWM in /proc/<pid>/status).
"""
import asyncio
import ssl
import struct
import sys


def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def request_headers(length):
    """HPACK, literals without indexing: POST https://localhost/validate."""
    lit = lambda b: bytes([len(b)]) + b  # noqa: E731
    return (b"\x83\x87" + b"\x04" + lit(b"/validate") + b"\x01" + lit(b"localhost")
            + b"\x0f\x10" + lit(b"application/json") + b"\x0f\x0d" + lit(str(length).encode()))


SMALL = frame(0, 0, 1, b"x" * 257)          # 257 flow-controlled bytes
JUNK = frame(0xFA, 0, 0, bytes(16000))      # an unknown type: thrown away


async def read_frames(reader, until_settings):
    while True:
        head = await reader.readexactly(9)
        await reader.readexactly(int.from_bytes(head[:3], "big"))
        if until_settings and head[3] == 4 and not head[4] & 1:
            return


async def open_stream(port, ctx):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b""))
    await read_frames(reader, True)
    writer.write(frame(4, 1, 0, b"") + frame(1, 4, 1, request_headers(8_000_000)))
    await writer.drain()
    # Window updates and answers are read, and ignored, from here on.
    return writer, asyncio.create_task(read_frames(reader, False))


async def waiting(port, ctx, n, big, hold):
    release = asyncio.Event()

    async def connection(send):
        writer, reading = await open_stream(port, ctx)
        if send == "big":
            for size in (16384, 16384, 16384, 16383):
                writer.write(frame(0, 0, 1, bytes(size)))
        elif send:
            for _ in range(65535 // 257):
                writer.write(SMALL + JUNK)
                await writer.drain()
        await writer.drain()
        await release.wait()
        reading.cancel()
        writer.close()

    fillers = [asyncio.create_task(connection(None)) for _ in range(4)]
    await asyncio.sleep(1)
    streams = [asyncio.create_task(connection("big" if big else "small")) for _ in range(n)]
    await asyncio.sleep(hold)
    release.set()
    results = await asyncio.gather(*fillers, *streams, return_exceptions=True)
    print("streams that failed:", sum(isinstance(r, Exception) for r in results))


async def admitted(port, ctx, megabytes):
    writer, reading = await open_stream(port, ctx)
    sent = 0
    while sent < megabytes * 1e6:
        writer.write(SMALL + JUNK)
        sent += 257
        await writer.drain()
    print("sent", sent, "bytes of body")
    await asyncio.sleep(3)
    reading.cancel()
    writer.close()


def main():
    port, ca, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["h2"])
    if mode == "admitted":
        asyncio.run(admitted(port, ctx, float(sys.argv[4])))
    else:
        asyncio.run(waiting(port, ctx, int(sys.argv[4]), sys.argv[5:] == ["big"], 20))


if __name__ == "__main__":
    main()
