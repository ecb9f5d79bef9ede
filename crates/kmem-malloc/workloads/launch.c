/* Runs a program and reports the program's own peak RSS and CPU time.
 *
 * Linux keeps a process's peak RSS across exec, and at exec it records the
 * peak of the memory image being replaced: a program started straight from
 * a large parent (the benchmark driver, a vfork or fork of it) reports at
 * least the parent's peak. So the driver starts this small launcher, which
 * forks and execs the program and reports the child's ru_maxrss: the image
 * that child replaces is the launcher's, a few hundred KiB.
 *
 * usage: launch PROGRAM [ARGS...]
 * The child gets LD_PRELOAD from KMEM_LAUNCH_PRELOAD (unset: no preload), so
 * that the launcher itself runs without the allocator under test. After the
 * program's own output, the last lines on stdout are "launch: cpu_us N"
 * (user and system time of the program, all its threads) and
 * "launch: maxrss_kb N".
 * The launcher exits as the program did (same status, or same signal). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: launch PROGRAM [ARGS...]\n");
    return 2;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    perror("launch: fork");
    return 2;
  }
  if (pid == 0) {
    const char *pre = getenv("KMEM_LAUNCH_PRELOAD");
    if (pre && *pre)
      setenv("LD_PRELOAD", pre, 1);
    else
      unsetenv("LD_PRELOAD");
    unsetenv("KMEM_LAUNCH_PRELOAD");
    execvp(argv[1], argv + 1);
    fprintf(stderr, "launch: exec %s: %s\n", argv[1], strerror(errno));
    _exit(127);
  }
  int status = 0;
  struct rusage ru;
  memset(&ru, 0, sizeof ru);
  while (wait4(pid, &status, 0, &ru) < 0) {
    if (errno != EINTR) {
      perror("launch: wait4");
      return 2;
    }
  }
  printf("launch: cpu_us %lld\n",
         (long long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000LL +
             ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  printf("launch: maxrss_kb %ld\n", ru.ru_maxrss);
  fflush(stdout);
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    signal(sig, SIG_DFL);
    raise(sig);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}
