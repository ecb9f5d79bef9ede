/* A small epoll HTTP/1.1 server for the webserver suite (seed 003's claim).
 *
 * One thread per core, each with its own epoll instance and its own listening
 * socket on the same port (SO_REUSEPORT), keep-alive connections. Every request
 * is parsed into owned buffers (the method, path and each header copied into
 * malloc'd strings on a list), and a response is built per request into a
 * malloc'd buffer (a small HTML page that echoes the path and the header
 * count), so the allocator is on the request path as in a real server.
 *
 * usage: webserver PORT THREADS    (runs until killed; prints "ready" once listening) */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct header { char *name, *value; struct header *next; } header_t;
typedef struct { char *method, *path; header_t *headers; int nheaders; } request_t;
typedef struct { int fd; char *buf; size_t len, cap; } conn_t;

static int port;

static char *dup_range(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (!p) return NULL;
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

static void free_request(request_t *r) {
  free(r->method);
  free(r->path);
  while (r->headers) {
    header_t *h = r->headers;
    r->headers = h->next;
    free(h->name);
    free(h->value);
    free(h);
  }
}

/* Parses one request from buf[0..end); returns 0 on success. */
static int parse(const char *buf, size_t end, request_t *r) {
  memset(r, 0, sizeof *r);
  const char *line_end = memmem(buf, end, "\r\n", 2);
  if (!line_end) return -1;
  const char *sp1 = memchr(buf, ' ', (size_t)(line_end - buf));
  if (!sp1) return -1;
  const char *sp2 = memchr(sp1 + 1, ' ', (size_t)(line_end - sp1 - 1));
  if (!sp2) return -1;
  r->method = dup_range(buf, (size_t)(sp1 - buf));
  r->path = dup_range(sp1 + 1, (size_t)(sp2 - sp1 - 1));
  const char *p = line_end + 2;
  while (p < buf + end) {
    const char *e = memmem(p, (size_t)(buf + end - p), "\r\n", 2);
    if (!e || e == p) break;
    const char *colon = memchr(p, ':', (size_t)(e - p));
    if (colon) {
      header_t *h = malloc(sizeof *h);
      if (!h) return -1;
      h->name = dup_range(p, (size_t)(colon - p));
      const char *v = colon + 1;
      while (v < e && *v == ' ') v++;
      h->value = dup_range(v, (size_t)(e - v));
      h->next = r->headers;
      r->headers = h;
      r->nheaders++;
    }
    p = e + 2;
  }
  return r->method && r->path ? 0 : -1;
}

static int respond(int fd, request_t *r) {
  size_t cap = 512 + strlen(r->path) * 2;
  char *body = malloc(cap);
  if (!body) return -1;
  int blen = snprintf(body, cap,
                      "<html><body><h1>kmem</h1><p>%s %s</p><p>%d headers</p></body></html>\n",
                      r->method, r->path, r->nheaders);
  char *resp = malloc((size_t)blen + 256);
  if (!resp) { free(body); return -1; }
  int n = snprintf(resp, (size_t)blen + 256,
                   "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
                   "Connection: keep-alive\r\n\r\n%s",
                   blen, body);
  ssize_t off = 0;
  while (off < n) {
    ssize_t w = write(fd, resp + off, (size_t)(n - off));
    if (w < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      break;
    }
    off += w;
  }
  free(body);
  free(resp);
  return off == n ? 0 : -1;
}

static void close_conn(int ep, conn_t *c) {
  epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  free(c->buf);
  free(c);
}

static void on_readable(int ep, conn_t *c) {
  for (;;) {
    if (c->cap - c->len < 1024) {
      size_t ncap = c->cap ? c->cap * 2 : 2048;
      char *nb = realloc(c->buf, ncap);
      if (!nb) { close_conn(ep, c); return; }
      c->buf = nb;
      c->cap = ncap;
    }
    ssize_t n = read(c->fd, c->buf + c->len, c->cap - c->len);
    if (n == 0) { close_conn(ep, c); return; }
    if (n < 0) {
      if (errno == EAGAIN) break;
      if (errno == EINTR) continue;
      close_conn(ep, c);
      return;
    }
    c->len += (size_t)n;
  }
  /* Serve every complete request in the buffer. */
  for (;;) {
    char *end = memmem(c->buf, c->len, "\r\n\r\n", 4);
    if (!end) break;
    size_t used = (size_t)(end - c->buf) + 4;
    request_t r;
    int ok = parse(c->buf, used, &r) == 0 && respond(c->fd, &r) == 0;
    free_request(&r);
    if (!ok) { close_conn(ep, c); return; }
    memmove(c->buf, c->buf + used, c->len - used);
    c->len -= used;
  }
  if (c->cap > 65536 && c->len < 1024) {
    char *nb = realloc(c->buf, 2048);
    if (nb) { c->buf = nb; c->cap = 2048; }
  }
}

static void *serve(void *arg) {
  (void)arg;
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  setsockopt(ls, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 1024) < 0) {
    perror("webserver: bind/listen");
    exit(1);
  }
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
  struct epoll_event evs[256];
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < n; i++) {
      if (evs[i].data.ptr == NULL) {
        for (;;) {
          int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
          if (fd < 0) break;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conn_t *c = calloc(1, sizeof *c);
          if (!c) { close(fd); continue; }
          c->fd = fd;
          struct epoll_event cev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
          epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
        }
      } else {
        on_readable(ep, evs[i].data.ptr);
      }
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  port = argc > 1 ? atoi(argv[1]) : 8080;
  int threads = argc > 2 ? atoi(argv[2]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (threads < 1) threads = 1;
  pthread_t th[256];
  for (int i = 0; i < threads && i < 256; i++) pthread_create(&th[i], NULL, serve, NULL);
  usleep(100000);
  printf("ready\n");
  fflush(stdout);
  for (int i = 0; i < threads && i < 256; i++) pthread_join(th[i], NULL);
  return 0;
}
