/* An LD_PRELOAD shim that hides every file named `_SUCCESS` younger than
 * $PZ_HIDE_SECS seconds (by its real mtime) from stat, open and readdir, as a network
 * filesystem's attribute and negative caches do (issue 27, item 3; tests/marker_visibility.rs).
 * With PZ_HIDE_STAT_ONLY=1 only stat is fooled (readdir and open see the file).
 * It removes LD_PRELOAD from its process's environment at load, so the jobs the controller
 * starts (which write the marker) are not affected. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double hide_secs;
static int stat_only;

__attribute__((constructor)) static void init(void) {
  const char *s = getenv("PZ_HIDE_SECS");
  hide_secs = s ? atof(s) : 0;
  stat_only = getenv("PZ_HIDE_STAT_ONLY") != NULL;
  unsetenv("LD_PRELOAD");
}

static int named_marker(const char *path) {
  const char *b = strrchr(path, '/');
  return strcmp(b ? b + 1 : path, "_SUCCESS") == 0;
}

/* Whether `path` (a marker) is younger than the hiding time, by the real statx. */
static int young(const char *path) {
  static int (*real)(int, const char *, int, unsigned, struct statx *);
  if (!real) real = dlsym(RTLD_NEXT, "statx");
  struct statx st;
  if (!real || real(AT_FDCWD, path, 0, STATX_MTIME, &st) != 0) return 0;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  double age = (double)(now.tv_sec - st.stx_mtime.tv_sec) +
               (double)(now.tv_nsec - (long)st.stx_mtime.tv_nsec) / 1e9;
  return age < hide_secs;
}

static int hidden(int dirfd, const char *path) {
  if (!path || !named_marker(path)) return 0;
  if (path[0] != '/' && dirfd != AT_FDCWD) return 0; /* not what the controller does */
  return young(path);
}

int statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *st) {
  static int (*real)(int, const char *, int, unsigned, struct statx *);
  if (!real) real = dlsym(RTLD_NEXT, "statx");
  if (hidden(dirfd, path)) { errno = ENOENT; return -1; }
  return real(dirfd, path, flags, mask, st);
}

int stat64(const char *path, struct stat64 *st) {
  static int (*real)(const char *, struct stat64 *);
  if (!real) real = dlsym(RTLD_NEXT, "stat64");
  if (hidden(AT_FDCWD, path)) { errno = ENOENT; return -1; }
  return real(path, st);
}

static int open_as(const char *sym, const char *path, int flags, mode_t mode) {
  int (*real)(const char *, int, ...) = dlsym(RTLD_NEXT, sym);
  if (!(flags & (O_CREAT | O_TMPFILE)) && !stat_only && hidden(AT_FDCWD, path)) {
    errno = ENOENT; return -1;
  }
  return real(path, flags, mode);
}

int open64(const char *path, int flags, ...) {
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap);
  }
  return open_as("open64", path, flags, mode);
}

int open(const char *path, int flags, ...) {
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) {
    va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap);
  }
  return open_as("open", path, flags, mode);
}

int stat(const char *path, struct stat *st) {
  static int (*real)(const char *, struct stat *);
  if (!real) real = dlsym(RTLD_NEXT, "stat");
  if (hidden(AT_FDCWD, path)) { errno = ENOENT; return -1; }
  return real(path, st);
}

/* Skips a young marker among the entries `next` returns (readdir and readdir64 alike). */
static void *skip_young(DIR *d, void *(*next)(DIR *), const char *(*name)(void *)) {
  for (;;) {
    void *e = next(d);
    if (!e || stat_only || strcmp(name(e), "_SUCCESS") != 0) return e;
    char link[64], dir[PATH_MAX], full[PATH_MAX + 16];
    snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd(d));
    ssize_t n = readlink(link, dir, sizeof dir - 1);
    if (n <= 0) return e;
    dir[n] = 0;
    snprintf(full, sizeof full, "%s/_SUCCESS", dir);
    if (!young(full)) return e;
  }
}

static const char *name64(void *e) { return ((struct dirent64 *)e)->d_name; }
static const char *name32(void *e) { return ((struct dirent *)e)->d_name; }

struct dirent64 *readdir64(DIR *d) {
  static void *(*real)(DIR *);
  if (!real) real = dlsym(RTLD_NEXT, "readdir64");
  return skip_young(d, real, name64);
}

struct dirent *readdir(DIR *d) {
  static void *(*real)(DIR *);
  if (!real) real = dlsym(RTLD_NEXT, "readdir");
  return skip_young(d, real, name32);
}
