"""The ground floor: helpers every layer may use, with no wsitool import but :mod:`wsitool.errors`.

Geometry of tiles and regions (:mod:`.geometry`), the area filter (:mod:`.areafilter`),
integer coercion of arguments (:mod:`.integers`), output files created exclusively and
renamed into place (:mod:`.outputs`), the bit streams of JPEG and JPEG 2000 headers
(:mod:`.bitstream`), photometric conversions (:mod:`.color`), the CUDA device
(:mod:`.device`), fork safety (:mod:`.forksafe`), operating-system errors (:mod:`.oserrors`),
the process's limits (:mod:`.limits`) and signal handling (:mod:`.signals`).
"""
