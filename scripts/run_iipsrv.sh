#!/bin/sh
# run_iipsrv.sh PORT CACHE_MB [PROCS] [DIR]: Debian's iipimage-server (iipsrv 1.1) behind lighttpd's
# FastCGI, in the foreground, on 127.0.0.1:PORT only, serving the TIFFs in DIR (default /tmp/iip).
# CACHE_MB is the total tile-cache budget, split evenly over the PROCS iipsrv processes.
# The peer of scripts/bench_serve.py (apt-get install iipimage-server lighttpd), e.g.:
#   python scripts/bench_serve.py SLIDE --iiif2-cmd "sh scripts/run_iipsrv.sh {port} {cache_mb}" \
#       --iiif2-base "http://127.0.0.1:{port}/fcgi-bin/iipsrv.fcgi?IIIF=NAME.tif"
set -e
PORT=$1; CACHE=$2; PROCS=${3:-2}; DIR=${4:-/tmp/iip}
PER=$((CACHE / PROCS))
mkdir -p "$DIR/www"
CONF=$DIR/lighttpd-$PORT.conf
cat > $CONF <<CONF
server.modules = ( "mod_fastcgi" )
server.bind = "127.0.0.1"
server.port = $PORT
server.document-root = "$DIR/www"
server.errorlog = "$DIR/lighttpd-error.log"
fastcgi.server = ( "/fcgi-bin/iipsrv.fcgi" => ((
  "socket" => "$DIR/iipsrv-$PORT.sock",
  "bin-path" => "/usr/lib/iipimage-server/iipsrv.fcgi",
  "max-procs" => $PROCS,
  "check-local" => "disable",
  "bin-environment" => (
    "LOGFILE" => "$DIR/iipsrv.log",
    "VERBOSITY" => "1",
    "FILESYSTEM_PREFIX" => "$DIR/",
    "MAX_IMAGE_CACHE_SIZE" => "$PER",
    "JPEG_QUALITY" => "90",
    "MAX_CVT" => "5000"
  )
)))
CONF
exec /usr/sbin/lighttpd -D -f $CONF
