/* A disk-less test guest for QEMU migration tests (Multiboot v1, 32-bit, no paging).
 *
 * Every pass checks that each 4 KiB page of two ranges still holds what the
 * previous pass wrote, counts the pages that do not, then writes the new pass:
 *   RAM     [16 MiB, 16 MiB + ram_mb MiB)   guest main RAM, migrated by QEMU;
 *   device  [dev_base, dev_base + dev_mb MiB) the second NUMA node, a share=on
 *           file that x-ignore-shared keeps out of QEMU's stream, so only an
 *           outside copy (the engine, or the test's dd) carries it across.
 * A page holds [pass, page index] in its first 8 bytes. The pass counter lives
 * in guest RAM, so a migrated guest continues on the destination and its first
 * pass there checks what the source's last pass wrote: a lost write shows up.
 *
 * Cmdline (QEMU prefixes the kernel path; tokens without '=' are ignored):
 *   ram_mb=N    RAM range size in MiB (default 32; 0 = none)
 *   dev_mb=N    device range size in MiB (default 0 = none)
 *   dev_base=A  device range start (decimal or 0x hex). The harness passes it:
 *               with `-numa node,memdev=` node 1 starts at GPA = node 0's size.
 *               Default: the top dev_mb MiB of memory, from Multiboot's mem_upper
 *               rounded up to a MiB (firmware tables take its last 128 KiB)
 *   period=N    PIT ticks of 10 ms between passes (default 50)
 *   every=N     print every Nth pass (default 1); a pass with bad pages always prints
 * Console (port 0xE9, QEMU -debugcon):
 *   GUEST-START ram=0x01000000+32M dev=0x04000000+32M period=10 every=1
 *   pass N ram_bad=X dev_bad=Y ticks=T
 *   GUEST-FAULT vec=V   (a CPU exception; the guest stops)
 *   GUEST-ERROR <why>   (bad cmdline; the guest stops)
 * Pacing: PIT channel 0 at 100 Hz, IRQ0 on vector 0x20 (PIC remapped), hlt
 * between ticks, so an idle guest costs little host CPU. */
#include <stdint.h>

#define PAGE 4096u
#define MIB (1024u * 1024u)
#define RAM_BASE (16u * MIB)

volatile uint32_t ticks; /* incremented by irq0_stub */
extern void reload_segments(void);
extern void irq0_stub(void), irq_other_stub(void);
extern const uint32_t fault_stubs[32];

static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port)); }

static void putc_e9(char c) { outb(0xE9, (uint8_t)c); }
static void puts_e9(const char* s) { while (*s) putc_e9(*s++); }
static void putu(uint32_t v) {
  char b[11];
  int n = 0;
  do { b[n++] = (char)('0' + v % 10); v /= 10; } while (v);
  while (n) putc_e9(b[--n]);
}
static void puthex(uint32_t v) {
  puts_e9("0x");
  for (int s = 28; s >= 0; s -= 4) putc_e9("0123456789abcdef"[(v >> s) & 15]);
}

static void stop(void) { for (;;) __asm__ volatile("cli; hlt"); }

void guest_fault(uint32_t vec) {
  puts_e9("GUEST-FAULT vec=");
  putu(vec);
  putc_e9('\n');
  stop();
}

/* Flat 4 GiB code (0x08) and data (0x10) segments (accessed bits preset). */
static const uint64_t gdt[3] = {0, 0x00CF9B000000FFFFull, 0x00CF93000000FFFFull};
static uint64_t idt[256];

struct __attribute__((packed)) table_ptr {
  uint16_t limit;
  uint32_t base;
};

static void set_gate(int vec, uint32_t handler) {
  idt[vec] = (handler & 0xFFFFu) | (0x08ull << 16) | (0x8Eull << 40) | ((uint64_t)(handler >> 16) << 48);
}

static void setup_cpu(void) {
  struct table_ptr g = {sizeof gdt - 1, (uint32_t)gdt};
  __asm__ volatile("lgdt %0" : : "m"(g));
  reload_segments();
  for (int v = 0; v < 32; ++v) set_gate(v, fault_stubs[v]);
  for (int v = 32; v < 48; ++v) set_gate(v, (uint32_t)irq_other_stub);
  for (int v = 48; v < 256; ++v) set_gate(v, fault_stubs[13]); /* nothing raises these */
  set_gate(32, (uint32_t)irq0_stub);
  struct table_ptr i = {sizeof idt - 1, (uint32_t)idt};
  __asm__ volatile("lidt %0" : : "m"(i));
  /* PICs: ICW1..ICW4, vectors 0x20 and 0x28, cascade on IRQ2; mask all but IRQ0. */
  outb(0x20, 0x11); outb(0xA0, 0x11);
  outb(0x21, 0x20); outb(0xA1, 0x28);
  outb(0x21, 0x04); outb(0xA1, 0x02);
  outb(0x21, 0x01); outb(0xA1, 0x01);
  outb(0x21, 0xFE); outb(0xA1, 0xFF);
  /* PIT channel 0, mode 2, 100 Hz (1193182 / 11932). */
  outb(0x43, 0x34);
  outb(0x40, 11932 & 0xFF);
  outb(0x40, 11932 >> 8);
  __asm__ volatile("sti");
}

/* "key=" at the start of a token in s: returns its value (decimal or 0x hex), else dflt. */
static uint32_t arg(const char* s, const char* key, uint32_t dflt) {
  for (const char* t = s; s && *t; ++t) {
    if (t != s && t[-1] != ' ') continue;
    const char* k = key;
    const char* p = t;
    while (*k && *p == *k) ++k, ++p;
    if (*k || *p != '=') continue;
    ++p;
    uint32_t v = 0;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
      for (p += 2;; ++p) {
        uint32_t d = (*p >= '0' && *p <= '9') ? (uint32_t)(*p - '0')
                     : ((*p | 32) >= 'a' && (*p | 32) <= 'f') ? (uint32_t)((*p | 32) - 'a' + 10) : 16u;
        if (d == 16) break;
        v = v * 16 + d;
      }
    } else {
      for (; *p >= '0' && *p <= '9'; ++p) v = v * 10 + (uint32_t)(*p - '0');
    }
    return v;
  }
  return dflt;
}

/* Checks the previous pass (when there was one), writes this one; returns bad pages. */
static uint32_t sweep(uint32_t base, uint32_t pages, uint32_t pass) {
  uint32_t bad = 0;
  for (uint32_t i = 0; i < pages; ++i) {
    volatile uint32_t* w = (volatile uint32_t*)(base + i * PAGE);
    if (pass > 1 && (w[0] != pass - 1 || w[1] != i)) ++bad;
    w[0] = pass;
    w[1] = i;
  }
  return bad;
}

/* In guest RAM, so that the destination continues the count. */
static uint32_t pass;

void kmain(uint32_t magic, const uint32_t* mbi) {
  setup_cpu();
  if (magic != 0x2BADB002u) { puts_e9("GUEST-ERROR not loaded by a Multiboot loader\n"); stop(); }
  const char* cmd = (mbi[0] & 4) ? (const char*)mbi[4] : 0;
  /* End of the memory above 1 MiB, rounded up to a MiB: the firmware's tables sit in its last KiBs. */
  uint32_t top = (mbi[0] & 1) ? (MIB + mbi[2] * 1024u + MIB - 1) & ~(MIB - 1) : 0;
  uint32_t ram_mb = arg(cmd, "ram_mb", 32), dev_mb = arg(cmd, "dev_mb", 0);
  uint32_t period = arg(cmd, "period", 50), every = arg(cmd, "every", 1);
  uint32_t dev_base = arg(cmd, "dev_base", dev_mb && top > dev_mb * MIB ? top - dev_mb * MIB : 0);
  if (every == 0) every = 1;
  if (dev_mb && (dev_base < RAM_BASE + ram_mb * MIB || dev_base % PAGE)) {
    puts_e9("GUEST-ERROR dev_base overlaps the RAM range or is not page aligned\n");
    stop();
  }
  if (top && (RAM_BASE + ram_mb * MIB > top || dev_base + dev_mb * MIB > top)) {
    puts_e9("GUEST-ERROR a range ends past the memory Multiboot reports\n");
    stop();
  }
  puts_e9("GUEST-START ram="); puthex(RAM_BASE); putc_e9('+'); putu(ram_mb);
  puts_e9("M dev="); puthex(dev_base); putc_e9('+'); putu(dev_mb);
  puts_e9("M period="); putu(period); puts_e9(" every="); putu(every); putc_e9('\n');
  for (;;) {
    /* Drop the TLB entry of pass's page before writing pass: under TCG, QEMU 7.2
     * (before upstream 03bfc2188f, QEMU 9.0) clears a page's migration dirty bit
     * without re-arming a TLB entry that already allows writes, so stores through
     * that entry are not tracked and the destination could get the page as it was
     * before the store (pass counted again: every page "bad"). The store below
     * fills a fresh entry, which honours the page's current dirty bit. */
    __asm__ volatile("invlpg %0" : : "m"(pass) : "memory");
    ++pass;
    uint32_t ram_bad = sweep(RAM_BASE, ram_mb * (MIB / PAGE), pass);
    uint32_t dev_bad = sweep(dev_base, dev_mb * (MIB / PAGE), pass);
    if (pass % every == 0 || ram_bad || dev_bad) {
      puts_e9("pass "); putu(pass);
      puts_e9(" ram_bad="); putu(ram_bad);
      puts_e9(" dev_bad="); putu(dev_bad);
      puts_e9(" ticks="); putu(ticks); putc_e9('\n');
    }
    uint32_t until = ticks + period;
    while ((int32_t)(ticks - until) < 0) __asm__ volatile("hlt");
  }
}
