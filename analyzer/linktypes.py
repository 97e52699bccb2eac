"""Link-layer header types (tcpdump.org LINKTYPE_ values) herdscope decodes, and their names.

Names follow Wireshark's ``capinfos`` wording so ``herdscope info`` reads like it.
"""

NULL = 0  # BSD loopback: 4-byte address family in the capturing host's byte order
ETHERNET = 1
RAW_DLT12 = 12  # DLT_RAW on most BSDs/Linux libpcap before LINKTYPE_RAW existed
RAW_DLT14 = 14  # DLT_RAW on OpenBSD
RAW = 101
LOOP = 108  # OpenBSD loopback: address family in network byte order
LINUX_SLL = 113
NFLOG = 239
IPV4 = 228
IPV6 = 229
LINUX_SLL2 = 276

NAMES = {
    NULL: "NULL/Loopback",
    ETHERNET: "Ethernet",
    RAW_DLT12: "Raw IP",
    RAW_DLT14: "Raw IP",
    RAW: "Raw IP",
    LOOP: "OpenBSD loopback",
    LINUX_SLL: "Linux cooked-mode capture v1",
    NFLOG: "NFLOG",
    IPV4: "Raw IPv4",
    IPV6: "Raw IPv6",
    LINUX_SLL2: "Linux cooked-mode capture v2",
}

SUPPORTED = frozenset(NAMES)

# Others worth naming in reports even though their frames are not decoded.
OTHER_NAMES = {
    6: "Token Ring",
    9: "PPP",
    10: "FDDI",
    105: "IEEE 802.11 Wireless LAN",
    127: "IEEE 802.11 plus radiotap radio header",
    192: "PPI",
    220: "USB Linux mmapped",
    249: "Bluetooth LE",
}


def name(linktype: int) -> str:
    return NAMES.get(linktype) or OTHER_NAMES.get(linktype) or f"LINKTYPE {linktype}"
