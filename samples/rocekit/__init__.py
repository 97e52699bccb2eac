"""The pieces of samples/rocev2_synth.py (issue 16), one job per module:

* :mod:`.wire` RoCEv2 and MAC-control encoders with the specification's constants (BTH, RETH, AETH,
  ImmDt, CNP, ICRC; 802.3x PAUSE, 802.1Qbb PFC; RNR timer table, ACK timeout, credit encoding,
  Linux's UDP source port of a QP);
* :mod:`.fabric` the event loop, switch/NIC egress ports (strict priority, ECN marking, PFC XOFF/XON
  with refresh, pauses obeyed per priority, lossy links) and the capture point;
* :mod:`.qp` hosts and the reliable-connected transport (requester, responder, ACK coalescing, NAK,
  go-back-N, ACK timeout, RNR, DCQCN);
* :mod:`.scenarios` the leaf-spine site, workloads, healthy traffic and the transport pathologies;
  :mod:`.congestion` PFC storm, incast, ignored CNPs; :mod:`.catalog` name -> builder;
* :mod:`.writer` the capture (through ``synthkit.writer.write_capture``), labels, :func:`~.writer.generate`.

See README.md here for the model, its limits and the handover to the decoder and detectors.
"""
