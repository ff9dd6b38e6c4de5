"""The clients behind the :class:`~wsitool.storage.remote.Transport` interface, one module each (floor 1).

* :mod:`.http`: HTTP(S) range requests (obstore; urllib3 in a process forked after obstore's
  first request, and for servers whose answers obstore cannot read);
* :mod:`.objectstore`: S3, Google Cloud Storage and Azure Blob Storage (obstore), and the
  fsspec option names translated;
* :mod:`.obstore_client`: the obstore calls both share (a ranged GET, its failures, the
  guard of obstore's runtime across ``fork()``);
* :mod:`.listing`: the objects under a bucket prefix.

Which transport a URL takes is :func:`~wsitool.storage.open_source`'s choice.
"""
