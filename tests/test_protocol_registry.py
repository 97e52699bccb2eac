"""A protocol is one declaration (analyzer/decoders/protocol.py) listed once (registry.py): every list
that names protocols is derived from the declarations, every declared frame builds, the client-side
rules work on captures that need them, and a throwaway decoder (tests/echo_decoder.py) registered by a
fixture shows up in stats, the transaction frames and the transaction detectors, then goes away."""
import importlib
import os
import subprocess
import sys

import numpy as np
import polars as pl
import pytest

from analyzer import stats, summary
from analyzer.decoders import common, registry
from analyzer.decoders.protocol import Protocol
from analyzer.messages import protocol_message_sets
from builders import ethernet, handshake, ipv4, pcap_file, tcp_conversation, udp
from detectors import base, conn_churn, herd, retry_storm

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "samples")
ROOT = os.path.join(os.path.dirname(__file__), "..")


# -- the derived lists equal the declarations ---------------------------------------------------------

def test_registry_lists_the_decoder_modules_once():
    names = [p.name for p in registry.protocols()]
    assert names == list(registry.PROTOCOL_MODULES) == ["dns", "kerberos", "ldap", "smb2", "nfs", "rocev2", "http"]
    for p in registry.protocols():
        module = importlib.import_module(f"analyzer.decoders.{p.name}")
        assert module.PROTOCOL is p
        assert registry.protocol(p.name) is p
        for frame in p.frames:
            assert registry.protocol_of_frame(frame) is p
    with pytest.raises(KeyError, match="known: dns, kerberos, ldap, smb2, nfs"):
        registry.protocol("nfs9")


def test_derived_lists_equal_the_declarations():
    declared = registry.protocols()
    tx = tuple(p.transactions for p in declared if p.transactions)
    assert tx == ("dns_transactions", "kerberos_transactions", "ldap_transactions", "smb2_transactions",
                  "nfs_transactions")
    assert registry.transaction_frames() == base.TRANSACTION_FRAMES == tx
    assert base.PROTOCOL_KINDS == tuple(p.name for p in declared if p.transactions)
    assert herd.KINDS == base.PROTOCOL_KINDS and retry_storm.KINDS == base.PROTOCOL_KINDS + ("tcp_syn",)
    assert set(tx) <= set(herd.REQUIRES) and set(tx) <= set(retry_storm.REQUIRES)
    assert stats.protocol_names() == {p.name: p.title for p in declared if p.transactions} == {
        "dns": "DNS", "kerberos": "Kerberos", "ldap": "LDAP", "smb2": "SMB2", "nfs": "NFS"}
    known = summary.services()
    for p in declared:
        assert all(known[port] == name for port, name in p.services.items())
    assert not set(summary.OTHER_SERVICES) & set(registry.service_names())  # one source per port
    assert [p.name for p in conn_churn._setup_protocols()] == ["ldap", "smb2", "nfs"]
    assert conn_churn._protocol_words("ldap") == ("LDAP operations (ldap_transactions)", "bind")
    assert conn_churn._protocol_words("smb2") == ("SMB2 opens (smb2_transactions)", "negotiate/session setup")
    assert conn_churn._protocol_words("tcp") == conn_churn.TCP_WORDS


def test_titles_and_declarations_hash_by_identity():
    declared = registry.protocols()
    assert registry.titles() == {p.name: p.title for p in declared}
    assert registry.titles(with_transactions=True) == stats.protocol_names()
    # frozen with dict fields: hashed and compared by identity, so declarations can key a dict
    assert len({p: p.name for p in declared}) == len(declared)
    dns = registry.protocol("dns")
    twin = Protocol(name=dns.name, title=dns.title, spec=dns.spec, services=dict(dns.services))
    assert twin != Protocol(name=dns.name, title=dns.title, spec=dns.spec, services=dict(dns.services))
    assert twin in {twin} and twin not in set(declared) and dns in set(declared)


def test_sentence_wording_comes_from_the_declarations():
    assert herd._verb("dns", "A", ttl=False) == "queried"
    assert herd._verb("dns", "A", ttl=True) == "re-queried"
    assert herd._verb("kerberos", "AS-REQ", ttl=False) == "sent AS-REQs for"
    assert herd._verb("kerberos", "TGS-REQ", ttl=False) == "sent TGS-REQs for"
    assert herd._verb("ldap", "searchRequest", ttl=False) == "sent searchRequest for"
    assert herd._verb("smb2", "", ttl=False) == "asked for"


def test_the_transaction_schema_has_one_copy():
    assert common.COMMON_NAMES == tuple(c.name for c in common.TRANSACTION_COMMON)
    assert tuple(common.TRANSACTION_TEXT_SCHEMA.names()) == common.COMMON_NAMES
    assert common.TRANSACTION_TEXT_SCHEMA["transport"] == pl.String  # the Enum as text, so protocols stack
    from dashboards import frames
    assert frames.TRANSACTIONS_SCHEMA is common.TRANSACTION_TEXT_SCHEMA
    for p in (p for p in registry.protocols() if p.transactions):  # rocev2 pairs no requests
        module = importlib.import_module(f"analyzer.decoders.{p.name}")
        cols = module.TRANSACTION_COLUMNS
        assert tuple(c.name for c in cols[:len(common.TRANSACTION_COMMON)]) == common.COMMON_NAMES


@pytest.mark.parametrize("sample,protocol", [
    ("dns-ttl-herd.pcap", "dns"), ("krb5-as-tgs-herd.pcapng", "kerberos"),
    ("ldap-conn-churn.pcap", "ldap"), ("smb2-break-queue.pcap", "smb2")])
def test_every_declared_frame_builds_on_a_sample(read_capture, sample, protocol):
    path = os.path.join(SAMPLES, sample)
    if not os.path.exists(path):
        pytest.fail(f"sample {sample} is missing")
    with open(path, "rb") as f:
        cap = read_capture(f.read(), name=sample)
    p = registry.protocol(protocol)
    for frame in p.frames:
        assert frame in cap.frame_names()
        built = cap.frame(frame)
        assert isinstance(built, pl.DataFrame)
    assert cap.frame(p.transactions).height > 0
    assert tuple(cap.frame(p.transactions).columns[:len(common.COMMON_NAMES)]) == common.COMMON_NAMES


def test_register_refuses_a_declaration_without_builders():
    class Module:
        PROTOCOL = Protocol(name="ghost", title="Ghost", spec="-", udp_ports=(9,), frames=("ghost_messages",))
    with pytest.raises(ValueError, match="no frame builder for ghost_messages"):
        registry.register(Module)
    assert "ghost" not in [p.name for p in registry.protocols()]


# -- a throwaway decoder: its own module plus one registration ------------------------------------------

@pytest.fixture
def echo():
    sys.modules.pop("echo_decoder", None)
    module = importlib.import_module("echo_decoder")  # its @frame_builder functions register its frames
    proto = registry.register(module)
    yield proto
    registry.unregister(proto.name)
    sys.modules.pop("echo_decoder", None)


CLIENTS = [f"10.0.1.{k}" for k in range(1, 41)]
SERVER = "10.0.0.7"


def echo_capture(n_clients=40, answered=True, t0=1_000_000_000, spacing_ns=1_000_000, rtt_ns=200_000):
    """Clients each sending the same Echo datagram to SERVER at nearly the same time, answered."""
    records = []
    for k, client in enumerate(CLIENTS[:n_clients]):
        t = t0 + k * spacing_ns
        data = b"ping-ping-%02d" % 0  # the same request from every client
        records.append((t, ethernet(ipv4(udp(data, sport=40000 + k, dport=7), proto=17, src=client, dst=SERVER))))
        if answered:
            records.append((t + rtt_ns, ethernet(ipv4(udp(data, sport=7, dport=40000 + k), proto=17, src=SERVER,
                                                      dst=client))))
    # quiet background: one client every few seconds (the herd's baseline)
    for j in range(12):
        t = t0 + 5_000_000_000 + j * 3_000_000_000
        records.append((t, ethernet(ipv4(udp(b"ping-ping-00", sport=50000 + j, dport=7), proto=17, src=CLIENTS[0],
                                         dst=SERVER))))
        records.append((t + rtt_ns, ethernet(ipv4(udp(b"ping-ping-00", sport=7, dport=50000 + j), proto=17,
                                                  src=SERVER, dst=CLIENTS[0]))))
    records.sort(key=lambda r: r[0])
    return pcap_file([(t // 10**9, t % 10**9, frame) for t, frame in records], nanosecond=True)


def test_a_registered_decoder_shows_up_everywhere_then_goes_away(read_capture, echo):
    assert registry.transaction_frames()[-1] == "echo_transactions"
    assert stats.protocol_names()["echo"] == "Echo"
    assert summary.services()[7] == "echo"
    cap = read_capture(echo_capture())
    tx = cap.frame("echo_transactions")
    assert tx.height == 52 and tx["answered"].all() and (tx["latency_ns"] == 200_000).all()
    # stats: the service response time of the new protocol, ordered after the declared ones
    srt = stats.service_response_times(cap)
    row = srt.filter(pl.col("protocol") == "echo").row(0, named=True)
    assert (row["operation"], row["count"], row["answered"], row["p50"]) == ("echo", 52, 52, 200_000)
    assert "Echo" in stats.no_transactions_message("x.pcap", cap)
    assert "Echo errors: none: an answer is the request's own bytes." in stats.outcome_help()
    # the transaction detectors read it (through the registry, when they are called)
    assert list(base.transaction_frames(cap)) == ["echo_transactions"]
    found = herd.detect(cap, herd.Params())
    assert found.height >= 1 and set(found["kind"]) == {"echo"}
    assert "40 clients sent echo for" in found["explanation"][0]
    # a detector running on its declared view does not read what it never declared
    view = base.CaptureView(cap, "herd", herd.REQUIRES)
    assert base.transaction_frames(view) == {}


def test_after_unregistering_the_decoder_is_gone(read_capture, echo):
    registry.unregister("echo")
    assert "echo_transactions" not in registry.transaction_frames()
    assert "echo" not in stats.protocol_names() and summary.services().get(7) is None
    assert "Echo" not in stats.outcome_help()
    cap = read_capture(echo_capture())
    with pytest.raises(KeyError):
        cap.frame("echo_transactions")


def test_registered_before_the_detectors_load_it_is_in_their_declarations(tmp_path):
    """In a fresh process, the decoder registered before ``detectors`` is imported (as the registry's
    own PROTOCOL_MODULES are): herd's REQUIRES and KINDS include it and ``detectors.run`` finds its herd."""
    path = tmp_path / "echo.pcap"
    path.write_bytes(echo_capture())
    code = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "import echo_decoder\n"
        "from analyzer.decoders import registry; registry.register(echo_decoder)\n"
        "import detectors\n"
        "from detectors import herd\n"
        "from analyzer import open_capture\n"
        "assert 'echo_transactions' in herd.REQUIRES and 'echo' in herd.KINDS\n"
        "assert 'echo_transactions' in detectors.required_frames(['herd'])\n"
        f"with open_capture({str(path)!r}) as cap:\n"
        "    found = detectors.run(cap, only=['herd'])\n"
        "print(sorted(set(found['kind'])))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['echo']"


# -- client-side rules -----------------------------------------------------------------------------------

def _udp_capture(packets):
    """packets: (t_ns, src, sport, dst, dport, payload)."""
    return pcap_file([(t // 10**9, t % 10**9, ethernet(ipv4(udp(p, sport=sp, dport=dp), proto=17, src=s, dst=d)))
                      for t, s, sp, d, dp, p in packets], nanosecond=True)


TAGGED_UDP = Protocol(name="tagged", title="Tagged", spec="-", udp_ports=(4791,), client_side="message",
                      message_direction="echo_decoder:tagged_direction")


def test_message_rule_on_one_port_at_both_ends_udp(read_capture, echo):
    a, b = ("10.0.0.1", 4791), ("10.0.0.2", 4791)
    cap = read_capture(_udp_capture([
        (1_000, *a, *b, b"Q1"), (2_000, *b, *a, b"R1"),  # a asks b
        (3_000, *b, *a, b"Q2"), (4_000, *a, *b, b"R2"),  # b asks a
    ]))
    sets = protocol_message_sets(cap, TAGGED_UDP)
    f = pl.concat([s.frame for s in sets])
    assert f["from_client"].to_list() == [True, False, True, False]
    flows = f["flow"].to_list()
    assert flows[0] == flows[1] and flows[2] == flows[3] and flows[0] != flows[2]
    # the service-port rule cannot tell: with the port at both ends every datagram is "to the service"
    plain = Protocol(name="plain", title="Plain", spec="-", udp_ports=(4791,))
    g = pl.concat([s.frame for s in protocol_message_sets(cap, plain)])
    assert g["from_client"].all() and g["flow"].n_unique() == 2


def test_connection_initiator_rule_on_udp_falls_back_to_the_service_port(read_capture):
    cap = read_capture(_udp_capture([(1_000, "10.0.0.1", 33000, "10.0.0.2", 7, b"x"),
                                     (2_000, "10.0.0.2", 7, "10.0.0.1", 33000, b"x")]))
    init = Protocol(name="i", title="I", spec="-", udp_ports=(7,), client_side="connection_initiator")
    svc = Protocol(name="s", title="S", spec="-", udp_ports=(7,))
    got = [pl.concat([s.frame for s in protocol_message_sets(cap, p)]) for p in (init, svc)]
    assert got[0]["from_client"].to_list() == got[1]["from_client"].to_list() == [True, False]


def _framed(payload: bytes) -> bytes:
    return len(payload).to_bytes(2, "big") + payload


def _callback_capture(read_capture, client_port=40000):
    """A TCP connection opened by 10.0.0.2 from the service port 870 to 10.0.0.1's ephemeral port
    (a server calling a client back): the SYN sender is not the side sending to the service port."""
    body = b"Q" + b"\0" * 13  # 14 bytes: at least the 12 a length16 message needs
    steps = handshake() + [
        {"t": 100_000, "from_client": True, "data": _framed(body), "seq": 1, "flags": 0x18},
        {"t": 200_000, "from_client": False, "data": _framed(b"R" + body[1:]), "seq": 1, "flags": 0x18},
    ]
    return read_capture(tcp_conversation(steps, client=("10.0.0.2", 870), server=("10.0.0.1", client_port)))


def test_service_port_and_connection_initiator_rules_on_tcp(read_capture):
    cap = _callback_capture(read_capture)
    conn = cap.frame("connections").row(0, named=True)
    assert (conn["client"], conn["client_port"]) == ("10.0.0.2", 870)  # analyzer.tcp: the SYN sender
    svc = Protocol(name="s", title="S", spec="-", tcp_ports=(870,), tcp_framing="length16")
    init = Protocol(name="i", title="I", spec="-", tcp_ports=(870,), tcp_framing="length16",
                    client_side="connection_initiator")
    by_svc = protocol_message_sets(cap, svc)[0].frame.sort("frame_first")
    by_init = protocol_message_sets(cap, init)[0].frame.sort("frame_first")
    # the first message goes 10.0.0.2:870 -> 10.0.0.1:40000
    assert by_svc["src"].cast(pl.String).to_list() == ["10.0.0.2", "10.0.0.1"]
    assert by_svc["from_client"].to_list() == [False, True]  # the side sending to 870 is the client
    assert by_init["from_client"].to_list() == [True, False]  # the SYN sender is the client
    assert protocol_message_sets(cap, svc)[0].stats["from_client"].sort().to_list() == [False, True]


def test_message_rule_on_tcp(read_capture, echo):
    cap = _callback_capture(read_capture)
    tagged = Protocol(name="t", title="T", spec="-", tcp_ports=(870,), tcp_framing="length16",
                      client_side="message", message_direction="echo_decoder:tagged_direction")
    f = protocol_message_sets(cap, tagged)[0].frame.sort("frame_first")
    assert f["from_client"].to_list() == [True, False]  # "Q" from the SYN sender, "R" back


def test_todays_protocols_keep_the_service_port_rule():
    assert {p.client_side for p in registry.protocols() if p.name not in ("rocev2", "nfs")} == {"service_port"}
    assert registry.protocol("rocev2").client_side == "message"  # UDP 4791 at both ends
    assert registry.protocol("nfs").client_side == "message"  # RPC msg_type; NFSv4.1 callbacks on one connection


def test_a_direction_function_must_answer_every_message(read_capture, echo, monkeypatch):
    cap = read_capture(_udp_capture([(1_000, "10.0.0.1", 4791, "10.0.0.2", 4791, b"Q")]))
    monkeypatch.setattr(sys.modules["echo_decoder"], "tagged_direction", lambda ms: np.zeros(0, bool))
    with pytest.raises(ValueError, match="returned 0 values for 1 messages"):
        protocol_message_sets(cap, TAGGED_UDP)
