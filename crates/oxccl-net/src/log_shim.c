/* The logger oxccl hands to network plugins.
 *
 * NCCL's ncclDebugLogger_t is C-variadic (printf-style). Stable Rust can call
 * such functions but cannot define one, so this shim formats the message and
 * passes the finished text to the sink that Rust installed. Lines longer than
 * the buffer are cut (NCCL's own logger cuts at 1024 bytes as well). */
#include <stdarg.h>
#include <stdio.h>

typedef void (*oxccl_net_sink_t)(int level, unsigned long flags, const char *file, int line,
                                 const char *msg);

static oxccl_net_sink_t oxccl_net_sink;

void oxccl_net_set_sink(oxccl_net_sink_t sink) {
  __atomic_store_n(&oxccl_net_sink, sink, __ATOMIC_RELEASE);
}

void oxccl_net_logger(int level, unsigned long flags, const char *file, int line, const char *fmt,
                      ...) {
  oxccl_net_sink_t sink = __atomic_load_n(&oxccl_net_sink, __ATOMIC_ACQUIRE);
  if (sink == NULL || fmt == NULL) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  sink(level, flags, file, line, buf);
}
