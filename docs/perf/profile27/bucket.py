#!/usr/bin/env python3
"""Bucket a flat `perf report --no-children --sort sym --stdio -g none` listing into cost groups."""
import re, sys
rows = []
for line in open(sys.argv[1]):
    m = re.match(r"\s*([\d.]+)%\s+\[(.)\]\s+(.*?)\s*$", line)
    if m:
        rows.append((float(m.group(1)), m.group(2), m.group(3)))
buckets = [
    ("kernel", lambda k, s: k == "k"),
    ("timers", lambda k, s: re.search(r"timer|TimerQueue|deadline|handle_timeout|Endpoint::after|poll_timeout|sift_", s, re.I)),
    ("allocator (malloc/free)", lambda k, s: re.search(r"malloc|_int_free|cfree|unlink_chunk|consolidate|^free$|realloc|__libc_free", s)),
    ("AES-GCM (aws-lc)", lambda k, s: re.search(r"aes|gcm|ghash|aead|polyval|gfmul", s, re.I)),
    ("FEC", lambda k, s: re.search(r"fec|sliding|FecLink", s, re.I)),
    ("session lookup", lambda k, s: re.search(r"Slot::prefetch|with_conn|slots::|route|lookup", s)),
    ("copies (memmove/memcpy)", lambda k, s: re.search(r"memmove|memcpy|memset", s)),
    ("bench handler", lambda k, s: s.startswith("<bench::") or s.startswith("bench::")),
    ("runtime + platform", lambda k, s: re.search(r"ricochet::|ricochet_platform|io_uring", s)),
    ("rest of protocol", lambda k, s: re.search(r"ricochet_proto", s)),
]
tot = {}
top = {}
for pct, k, s in rows:
    for name, f in buckets + [("other user", lambda k, s: True)]:
        if f(k, s):
            tot[name] = tot.get(name, 0) + pct
            top.setdefault(name, []).append((pct, s))
            break
for name in [b[0] for b in buckets] + ["other user"]:
    if name in tot:
        t = sorted(top[name], reverse=True)[:5]
        short = lambda s: re.sub(r"<impl [^>]*>::|ricochet_proto::|ricochet::", "", s)[:70]
        print(f"{tot[name]:6.1f} %  {name}: " + ", ".join(f"{short(s)} {p:.1f} %" for p, s in t))
print(f"{sum(tot.values()):6.1f} % total")
