"""What the pages show of the queue beyond its rows: where a request stands and when it should
be back (estimates), each user's and group's share under the sharing policy (shares), and the live
staging page's figures (live). Reads only; above the policies, which they run."""
