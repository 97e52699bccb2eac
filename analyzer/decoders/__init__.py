"""Protocol decoders: DNS, Kerberos, LDAP, SMB2/3. See README.md in this folder for the contract."""
