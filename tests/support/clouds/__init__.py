"""The clouds' test doubles, one folder per cloud and the same shape in each: ``fake`` (the
cloud's API, served on loopback or the test bridge, spoken to by the real SDK), ``standins``
(network-namespace hosts that play the machines the fake says it runs), ``pools`` (a provider
pointed at the fake, and what the fake holds for a pool; GCP keeps these in its
``standins``). AWS adds ``proxy``, a proxy in front of moto that makes EC2 refuse what moto
never refuses."""
