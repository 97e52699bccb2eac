"""The pieces of samples/synth.py, one job per module (``samples/synth.py`` is the CLI and re-exports
the names other code imports; see its docstring for what a capture contains).

Wire encoders (bytes out, no state, no randomness except where a field is random on the wire):

* :mod:`.der` ASN.1 DER/BER (X.690) used by Kerberos, LDAP and SPNEGO;
* :mod:`.kerberos` (RFC 4120), :mod:`.ldap` (RFC 4511), :mod:`.dns` (RFC 1035, 3596, 6891),
  :mod:`.ntlm` (NTLMSSP, MS-NLMP; SPNEGO, RFC 4178), :mod:`.smb2` (MS-SMB2 and NBSS, RFC 1002).

Packets and connections:

* :mod:`.frames` hosts, one-direction paths and the packet store (Ethernet/IPv4/IPv6/TCP/UDP
  headers and checksums: packet emission);
* :mod:`.tcp` the TCP connection model (handshake, delayed ACKs, windows, losses: TCP state);
* :mod:`.sessions` SMB2 and LDAP client conversations on top of :class:`.tcp.Tcp`.

The generator (:class:`.generator.Gen`), split by job:

* :mod:`.site` the site (hosts, DNS zone, users), the random stream and the labels;
* :mod:`.traffic` normal sessions (DNS, Kerberos, LDAP, SMB2, HTTP, syslog);
* :mod:`.pathologies` the labelled episodes;
* :mod:`.generator` scheduling: the showcase, the session mix and :meth:`~.generator.Gen.build`.

Output: :mod:`.writer` (pcap / pcapng writer, labels JSON, :func:`~.writer.generate`).
Shared constants (time units, the capture epoch, label keys): :mod:`.base`.
"""
