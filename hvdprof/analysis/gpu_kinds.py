"""Names of GPU work shared by the analyses that read a GPU trace (the device analysis,
its lanes in the timeline window): the kinds a kernel is sorted into, and a kernel's name
as a person reads it. Below the analyses, so that neither imports the other for them."""

from __future__ import annotations

#: The kinds of GPU work, in the order of the columns that count them (HTA's temporal
#: breakdown's kinds).
GPU_KIND_NAMES: tuple[str, ...] = ("computation", "communication", "memory", "other")
#: Longest kernel name shown whole; longer C++ template names are shortened for display.
SHORT_NAME_CHARS = 60


def short_kernel_name(name: str, limit: int = SHORT_NAME_CHARS) -> str:
    """A kernel's name as a person reads it: no ``void``, no parameter list, template
    arguments cut to fit ``limit`` (``at::native::vectorized_elementwise_kernel<4, ...>``)."""
    s = name.strip().replace("(anonymous namespace)::", "{anon}::")
    if s.startswith("void "):
        s = s[5:]
    depth = 0
    for i, ch in enumerate(s):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0 and not s[i - 1].isspace():
            s = s[:i]  # a parameter list (not "Memcpy DtoD (Device -> Device)")
            break
    if len(s) <= limit:
        return s
    cut = s.find("<")
    if 0 < cut <= limit - 3:
        # the template's leading arguments, whole, as many as fit
        args, depth, begin = [], 0, cut + 1
        for i in range(cut + 1, len(s)):
            ch = s[i]
            if ch in "<(":
                depth += 1
            elif ch in ">)":
                depth -= 1
                if depth < 0:
                    break
            elif ch == "," and depth == 0:
                args.append(s[begin:i].strip())
                begin = i + 1
        kept = ""
        for arg in args:
            longer = f"{kept}, {arg}" if kept else arg
            if cut + len(longer) + 5 > limit:  # name<kept, …>
                break
            kept = longer
        return s[:cut] + "<" + (kept + ", " if kept else "") + "\u2026>"
    # a long name: its start and its end (where kernels of one family differ)
    head = s[:cut] if cut > 0 else s
    keep = limit - 5 if cut > 0 else limit - 1
    middle = head[: keep // 2] + "\u2026" + head[len(head) - (keep - keep // 2) :]
    return middle + ("<\u2026>" if cut > 0 else "")
