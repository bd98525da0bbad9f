"""native/snapshot.c as the recorder and the replay core use it: from C and C++ directly, warning-free,
under AddressSanitizer and UBSan (corrupt files, thread-local errors, a full disk); and the cffi build."""

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native"
WARN = ["-Wall", "-Wextra", "-Werror"]


def run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.mark.parametrize("compiler", [["gcc", "-std=c11"], ["g++", "-x", "c++"], ["g++", "-x", "c++", "-std=c++11"]])
@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_compiles_warning_free_as_c_and_cpp(tmp_path, compiler, opt):
    if not shutil.which(compiler[0]):
        pytest.skip(f"{compiler[0]} not installed")
    run([*compiler, *WARN, opt, "-c", NATIVE / "snapshot.c", "-o", tmp_path / "s.o"])
    undefined = run(["nm", "-u", tmp_path / "s.o"]).stdout.split()
    assert not [sym for sym in undefined if sym.startswith("cu")]  # no CUDA dependency
    assert "#include <cuda" not in (NATIVE / "snapshot.c").read_text()


DRIVER = textwrap.dedent(r"""
    #include "snapshot.h"
    #include <pthread.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>

    #define CHECK(c) do { if (!(c)) { fprintf(stderr, "line %d: %s (%s)\n", __LINE__, #c, mn_last_error()); exit(1); } } while (0)

    static uint8_t *slurp(const char *p, size_t *n) {
      FILE *f = fopen(p, "rb"); CHECK(f);
      fseek(f, 0, SEEK_END); *n = (size_t)ftell(f); fseek(f, 0, SEEK_SET);
      uint8_t *d = (uint8_t *)malloc(*n); CHECK(fread(d, 1, *n, f) == *n); fclose(f);
      return d;
    }
    static void spit(const char *p, const uint8_t *d, size_t n) {
      FILE *f = fopen(p, "wb"); CHECK(f); CHECK(fwrite(d, 1, n, f) == n); fclose(f);
    }
    static uint64_t touch(const mn_snapshot *s) {  /* reads every byte the snapshot points at */
      uint64_t t = 0;
      for (uint32_t i = 0; i < s->nblobs; i++) {
        const mn_blob *b = &s->blobs[i];
        uint64_t stored = b->encoding == MN_ENC_BYTES ? b->size : 0;
        for (uint32_t r = 0; r < b->nranges; r++) stored += b->ranges[r].length;
        for (uint64_t k = 0; k < stored; k++) t += b->data[k];
      }
      for (uint32_t i = 0; i < s->nvars; i++) {
        t += strlen(s->vars[i].name);
        for (uint64_t k = 0; k < s->vars[i].size; k++) t += s->vars[i].data[k];
        for (uint32_t r = 0; r < s->vars[i].nrelocs; r++) if (s->vars[i].relocs[r].target) t += strlen(s->vars[i].relocs[r].target);
      }
      for (uint32_t i = 0; i < s->args.count; i++)
        for (uint32_t k = 0; k < s->args.sizes[i]; k++) t += s->args.bytes[s->args.offsets[i] + k];
      for (uint32_t i = 0; i < s->nannots; i++) t += strlen(s->annots[i].tag);
      return t;
    }
    static void *thread_err(void *arg) {
      const char *path = (const char *)arg;
      for (int i = 0; i < 200; i++) {
        CHECK(!mn_snapshot_read(path));
        CHECK(strstr(mn_last_error(), path));
      }
      return NULL;
    }

    int main(int argc, char **argv) {
      (void)argc;
      int rounds = atoi(argv[2]);
      char pro[512], epi[512], bad[512];
      snprintf(pro, sizeof pro, "%s/p.snap", argv[1]);
      snprintf(epi, sizeof epi, "%s/e.snap", argv[1]);
      snprintf(bad, sizeof bad, "%s/bad.snap", argv[1]);
      static uint8_t before[100000], after[100000];
      for (size_t i = 0; i < sizeof before; i++) before[i] = after[i] = (uint8_t)(i * 7);
      after[5] ^= 1; after[99999] ^= 1; memset(after + 500, 0, 300);

      mn_writer *w = mn_writer_open(pro, MN_PROLOGUE); CHECK(w);
      CHECK(mn_writer_blob(w, 0x1000, sizeof before, MN_SPACE_DEVICE, before) == 0);
      CHECK(mn_writer_blob(w, 0x90000, 0, MN_SPACE_HOST_PINNED, NULL) == 0);
      mn_reloc rel[2]; memset(rel, 0, sizeof rel);
      rel[0].offset = 0; rel[0].target = (char *)"other"; rel[0].target_offset = 4; rel[1].offset = 8;
      uint8_t var[16]; memset(var, 3, sizeof var);
      CHECK(mn_writer_var(w, "g", 0x500, sizeof var, 0, var, 2, rel) == 0);
      uint32_t offs[2] = {0, 8}, sizes[2] = {8, 4}; uint8_t args[12] = {1, 2, 3};
      CHECK(mn_writer_args(w, 2, offs, sizes, sizeof args, args) == 0);
      mn_annot an; memset(&an, 0, sizeof an);
      an.addr = 0x1000; an.size = 64; an.elem = MN_ELEM_F32; an.tol = 0.5; strcpy(an.tag, "t");
      CHECK(mn_writer_annot(w, &an) == 0);
      CHECK(mn_writer_bytes(w) > sizeof before);
      CHECK(mn_writer_close(w) == 0);

      w = mn_writer_open(epi, MN_EPILOGUE); CHECK(w);
      CHECK(mn_writer_blob_epilogue(w, 0x1000, sizeof before, 0, before, after, MN_EPI_BEST, 16) == 0);
      CHECK(mn_writer_close(w) == 0);

      mn_snapshot *p = mn_snapshot_read(pro), *e = mn_snapshot_read(epi);
      CHECK(p && e);
      CHECK(p->nblobs == 2 && p->nvars == 1 && p->has_args && p->nannots == 1 && e->nblobs == 1);
      CHECK(e->blobs[0].encoding == MN_ENC_DIFF && e->blobs[0].nranges == 3);
      CHECK(mn_snapshot_find_blob(p, 0x1000 + 99999) == &p->blobs[0]);
      CHECK(!strcmp(mn_snapshot_find_var(p, "g")->relocs[0].target, "other"));
      CHECK(mn_snapshot_apply(p, e) == 0);
      CHECK(e->nblobs == 2 && e->nvars == 1 && e->has_args && e->nannots == 1);
      CHECK(!memcmp(e->blobs[0].data, after, sizeof after));
      mn_snapshot_free(p);  /* the epilogue owns copies of what it took from the prologue */
      CHECK(!strcmp(e->vars[0].relocs[0].target, "other") && e->args.bytes[2] == 3);
      mn_cmp_report rep;
      CHECK(mn_compare(before, after, sizeof before, MN_ELEM_BYTES, 0, 0, -1, &rep) == 0 && rep.first_mismatch == 5);
      mn_range *rg = NULL;
      CHECK(mn_diff_ranges(before, after, sizeof before, 16, &rg) == 3 && rg[1].offset == 500);
      mn_free(rg);
      touch(e);
      mn_snapshot_free(e);

      /* every truncation and every bit flip: refused, memory-safe */
      size_t n; uint8_t *data = slurp(pro, &n);
      uint8_t *copy = (uint8_t *)malloc(n);
      for (size_t cut = 0; cut < n; cut += (cut < 300 ? 1 : 211)) {
        spit(bad, data, cut);
        CHECK(!mn_snapshot_read(bad) && strstr(mn_last_error(), "byte "));
      }
      for (size_t pos = 0; pos < n; pos += (pos < 200 ? 1 : 97)) {
        memcpy(copy, data, n); copy[pos] ^= (uint8_t)(1u << (pos % 8));
        spit(bad, copy, n);
        CHECK(!mn_snapshot_read(bad));
      }
      /* structured fuzz: edit payload fields, keep checksums valid */
      srand(7);
      size_t recs[16], nrec = 0;
      for (size_t off = 32; off < n && nrec < 16;) {
        uint64_t len; memcpy(&len, data + off + 8, 8);
        recs[nrec++] = off; off += 16 + len + ((8 - len % 8) % 8) + 8;
      }
      mn_snapshot *base = mn_snapshot_read(pro); CHECK(base);
      int accepted = 0;
      for (int round = 0; round < rounds; round++) {
        memcpy(copy, data, n);
        size_t off = recs[rand() % (nrec - 1)];
        uint64_t len; memcpy(&len, copy + off + 8, 8);
        uint64_t body = 16 + len + ((8 - len % 8) % 8);
        for (int k = rand() % 4 + 1; k; k--) {
          size_t at = off + 16 + (size_t)rand() % (len < 80 ? len : 80);
          uint64_t vals[] = {0, 1, 0xff, 0xffffffffu, 1ull << 63, ~0ull, (uint64_t)rand() * 2654435761u};
          uint64_t v = vals[rand() % 7];
          size_t width = (size_t)1 << (rand() % 4);
          if (at + width > off + body) width = 1;
          memcpy(copy + at, &v, width);
        }
        uint64_t sum = mn_checksum(copy + off, body, 0);
        memcpy(copy + off + body, &sum, 8);
        spit(bad, copy, n);
        mn_snapshot *s = mn_snapshot_read(bad);
        if (!s) { CHECK(strstr(mn_last_error(), bad)); continue; }
        accepted++;
        touch(s);
        mn_snapshot_free(s);
      }
      mn_snapshot_free(base);
      printf("accepted %d\n", accepted);

      /* thread-local errors */
      char other[512]; snprintf(other, sizeof other, "%s/nothing_here.snap", argv[1]);
      pthread_t t1, t2;
      pthread_create(&t1, NULL, thread_err, bad);
      pthread_create(&t2, NULL, thread_err, other);
      pthread_join(t1, NULL); pthread_join(t2, NULL);

      /* a full disk fails the writer and every later call */
      w = mn_writer_open("/dev/full", MN_PROLOGUE); CHECK(w);
      static uint8_t big[3 << 20];
      CHECK(mn_writer_blob(w, 0, sizeof big, 0, big) == -1 && strstr(mn_last_error(), "No space left"));
      CHECK(mn_writer_blob(w, 0, 1, 0, big) == -1 && strstr(mn_last_error(), "No space left"));
      CHECK(mn_writer_close(w) == -1);
      free(data); free(copy);
      puts("ok");
      return 0;
    }
""")


@pytest.mark.parametrize("lang", ["c", "c++"])
def test_c_api_under_sanitizers(tmp_path, lang):
    if not shutil.which("gcc") or not shutil.which("g++"):
        pytest.skip("gcc/g++ not installed")
    driver = tmp_path / "driver.c"
    driver.write_text(DRIVER)
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g", "-O1"]
    run(["gcc", "-std=c11", *WARN, *san, "-c", NATIVE / "snapshot.c", "-o", tmp_path / "snapshot.o"])
    front = ["gcc", "-std=c11"] if lang == "c" else ["g++", "-x", "c++"]
    run([*front, *WARN, *san, f"-I{NATIVE}", "-c", driver, "-o", tmp_path / "driver.o"])
    run(["g++", *san, tmp_path / "driver.o", tmp_path / "snapshot.o", "-pthread", "-lm", "-o", tmp_path / "driver"])
    rounds = 3000 if lang == "c" else 200  # C++ proves the header's linkage; C runs the long fuzz
    out = run([tmp_path / "driver", tmp_path, str(rounds)], timeout=300).stdout
    accepted = int(out.split()[1])
    assert out.strip().endswith("ok") and 0 < accepted < rounds


def _build_copy(tmp_path, *flags):
    """Builds the extension from a copy of native/ (so the tree's own build is left alone)."""
    root = tmp_path / "tree"
    shutil.copytree(NATIVE, root / "native", ignore=shutil.ignore_patterns("*.o", "*.so", "__pycache__"))
    (root / "mneme").mkdir()
    run([sys.executable, root / "native" / "build_native.py", *flags], timeout=300)
    built = list((root / "mneme").glob("_native*.so"))
    assert len(built) == 1
    return built[0]


@pytest.mark.slow
@pytest.mark.parametrize("flags", [(), ("--direct",)], ids=["cffi", "direct"])
def test_build_native_makes_an_importable_extension(tmp_path, flags):
    so = _build_copy(tmp_path, *flags)
    probe = textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("mneme._native", {str(so)!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        print(hex(mod.lib.mn_checksum(b"abc", 3, 0)))
    """)
    # importing must work without a GPU driver (none exists on the CI machine)
    out = run([sys.executable, "-c", probe], timeout=60).stdout
    assert out.strip() == "0x44bc2cf5ad770999"
    assert importlib.util.find_spec("cffi") is not None
