# Sourced on the GPU machine: installs the carried wheels and builds the native parts once per machine.
SITE=/tmp/mneme-site
if [ ! -f "$SITE/.installed" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .bundle/wheels/*.whl >/tmp/mneme-pip.log 2>&1 || { cat /tmp/mneme-pip.log; return 1; }
  touch "$SITE/.installed"
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PWD/scripts/bin:$PATH"
export MNEME_COMMIT="$(cat .bundle/COMMIT 2>/dev/null || echo unknown)"
if [ ! -f mneme/lib/librecord.so ] || [ ! -f mneme/lib/libapply.so ] || ! ls mneme/_native*.so >/dev/null 2>&1; then
  { python3 native/build_native.py && make -C native/recorder OUT="$PWD/mneme/lib" && make -C native/apply OUT="$PWD/mneme/lib"; } >/tmp/mneme-native.log 2>&1 \
    || { cat /tmp/mneme-native.log; return 1; }
fi
# ptxas in-process (mneme.ir.ptxcompiler), from the toolkit's lib64/libnvptxcompiler_static.a; optional, tried once
if [ ! -f mneme/lib/libmneme_ptxc.json ] && [ ! -f /tmp/mneme-ptxc.tried ]; then
  touch /tmp/mneme-ptxc.tried
  python3 native/ptxcompiler/build_ptxcompiler.py >/tmp/mneme-ptxc.log 2>&1 || cat /tmp/mneme-ptxc.log
fi
