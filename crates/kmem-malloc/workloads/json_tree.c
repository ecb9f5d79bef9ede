/* Build and tear down trees shaped like parsed JSON documents, where most
 * allocations are 8-32 bytes: the shape of a program that parses, queries
 * and drops JSON (a jq-like tool, a config loader, a REST handler).
 *
 * A value is a 16-byte node (tag, length, and a number or a pointer).
 * Strings and object keys are their own allocations of their length plus
 * one (keys 2-16 bytes, strings 1-32); arrays hold a vector of value
 * pointers and objects a vector of (key, value) pairs, both grown by
 * realloc from 2 entries, doubling, as a parser appends. Documents are
 * built depth first (objects of 1-8 members, arrays of 0-12 items, nested
 * up to 6 deep; of the other values 45 % strings, 22 % numbers and 15 %
 * true/false/null, the rest strings where no container may go)
 * until they hold NODES values; KEEP documents stay alive, the oldest
 * freed whole (recursively) when a new one is done, so that frees come in
 * large batches of another document's age. Each document is walked once
 * (the checksum) before it is freed.
 *
 * usage: json_tree DOCUMENTS NODES KEEP */
#include "common.h"

enum { T_NULL, T_BOOL, T_NUM, T_STR, T_ARR, T_OBJ };

typedef struct Val {
  uint32_t tag;
  uint32_t len;
  union {
    double num;
    char *str;
    struct Val **items;
    struct Member *members;
  } u;
} Val;

typedef struct Member {
  char *key;
  Val *val;
} Member;

static uint64_t rng = 0x6a736f6e74726565ULL;
static long budget;

static char *make_str(size_t lo, size_t hi) {
  size_t n = rng_range(&rng, lo, hi);
  char *s = xmalloc(n + 1);
  for (size_t i = 0; i < n; i++) s[i] = (char)('a' + rng_next(&rng) % 26);
  s[n] = 0;
  return s;
}

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n);
  if (!q) die("realloc returned NULL");
  return q;
}

static Val *make(int depth) {
  Val *v = xmalloc(sizeof *v);
  budget--;
  uint64_t r = rng_next(&rng) % 100;
  int container = depth < 6 && budget > 0 && r < 18;
  if (container && r < 9) {
    v->tag = T_OBJ;
    v->len = 0;
    v->u.members = NULL;
    size_t n = rng_range(&rng, 1, 8), cap = 0;
    for (size_t i = 0; i < n && budget > 0; i++) {
      if (v->len == cap) {
        cap = cap ? cap * 2 : 2;
        v->u.members = xrealloc(v->u.members, cap * sizeof(Member));
      }
      Member *m = &v->u.members[v->len++];
      m->key = make_str(2, 16);
      m->val = make(depth + 1);
    }
  } else if (container) {
    v->tag = T_ARR;
    v->len = 0;
    v->u.items = NULL;
    size_t n = rng_range(&rng, 0, 12), cap = 0;
    for (size_t i = 0; i < n && budget > 0; i++) {
      if (v->len == cap) {
        cap = cap ? cap * 2 : 2;
        v->u.items = xrealloc(v->u.items, cap * sizeof(Val *));
      }
      v->u.items[v->len++] = make(depth + 1);
    }
  } else if (r < 63) {
    v->tag = T_STR;
    v->u.str = make_str(1, 32);
    v->len = (uint32_t)strlen(v->u.str);
  } else if (r < 85) {
    v->tag = T_NUM;
    v->len = 0;
    v->u.num = (double)(rng_next(&rng) % 1000000) / 100.0;
  } else {
    v->tag = r < 95 ? T_BOOL : T_NULL;
    v->len = (uint32_t)(r & 1);
    v->u.str = NULL;
  }
  return v;
}

static uint64_t walk(const Val *v, uint64_t h) {
  h = mix(h, v->tag);
  switch (v->tag) {
  case T_NUM:
    return mix(h, (uint64_t)(v->u.num * 100.0));
  case T_STR:
    for (uint32_t i = 0; i < v->len; i++) h = mix(h, (unsigned char)v->u.str[i]);
    return h;
  case T_ARR:
    for (uint32_t i = 0; i < v->len; i++) h = walk(v->u.items[i], h);
    return h;
  case T_OBJ:
    for (uint32_t i = 0; i < v->len; i++) {
      h = mix(h, strlen(v->u.members[i].key));
      h = walk(v->u.members[i].val, h);
    }
    return h;
  default:
    return mix(h, v->len);
  }
}

static void drop(Val *v) {
  switch (v->tag) {
  case T_STR:
    free(v->u.str);
    break;
  case T_ARR:
    for (uint32_t i = 0; i < v->len; i++) drop(v->u.items[i]);
    free(v->u.items);
    break;
  case T_OBJ:
    for (uint32_t i = 0; i < v->len; i++) {
      free(v->u.members[i].key);
      drop(v->u.members[i].val);
    }
    free(v->u.members);
    break;
  }
  free(v);
}

int main(int argc, char **argv) {
  long docs = arg_long(argc, argv, 1, 20);
  long nodes = arg_long(argc, argv, 2, 200000);
  long keep = arg_long(argc, argv, 3, 4);
  if (docs < 1 || nodes < 1 || keep < 1) die("bad arguments");
  Val **live = calloc((size_t)keep, sizeof *live);
  if (!live) die("calloc");
  uint64_t h = 0;
  for (long d = 0; d < docs; d++) {
    /* The root object takes members until the document is full. */
    Val *root = xmalloc(sizeof *root);
    root->tag = T_OBJ;
    root->len = 0;
    root->u.members = NULL;
    size_t cap = 0;
    budget = nodes;
    while (budget > 0) {
      if (root->len == cap) {
        cap = cap ? cap * 2 : 2;
        root->u.members = xrealloc(root->u.members, cap * sizeof(Member));
      }
      Member *m = &root->u.members[root->len++];
      m->key = make_str(2, 16);
      m->val = make(1);
    }
    h = walk(root, h);
    long slot = d % keep;
    if (live[slot]) drop(live[slot]);
    live[slot] = root;
  }
  for (long i = 0; i < keep; i++)
    if (live[i]) drop(live[i]);
  free(live);
  printf("checksum %016llx\n", (unsigned long long)h);
  return 0;
}
