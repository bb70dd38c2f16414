// What Debian 12's linux-libc-dev (6.1) lacks of the userfaultfd and pagemap
// uAPI that the running kernel (>= 6.7) has, with upstream's values from
// include/uapi/linux/{userfaultfd,fs}.h. Each piece is guarded so that newer
// headers win: build on a distribution with 6.7+ headers and these vanish.
#pragma once

#include <linux/fs.h>
#include <linux/ioctl.h>
#include <linux/types.h>
#include <linux/userfaultfd.h>

#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

#ifndef PAGEMAP_SCAN
// Page categories reported by PAGEMAP_SCAN.
#define PAGE_IS_WPALLOWED (1 << 0)
#define PAGE_IS_WRITTEN (1 << 1)
#define PAGE_IS_FILE (1 << 2)
#define PAGE_IS_PRESENT (1 << 3)
#define PAGE_IS_SWAPPED (1 << 4)
#define PAGE_IS_PFNZERO (1 << 5)
#define PAGE_IS_HUGE (1 << 6)
#define PAGE_IS_SOFT_DIRTY (1 << 7)

struct page_region {
  __u64 start;
  __u64 end;
  __u64 categories;
};

// Write-protect the pages it matches (read-and-clear for async uffd-wp).
#define PM_SCAN_WP_MATCHING (1 << 0)
// Fail with EPERM unless the whole range is registered with async uffd-wp.
#define PM_SCAN_CHECK_WPASYNC (1 << 1)

struct pm_scan_arg {
  __u64 size;
  __u64 flags;
  __u64 start;
  __u64 end;
  __u64 walk_end;
  __u64 vec;
  __u64 vec_len;
  __u64 max_pages;
  __u64 category_inverted;
  __u64 category_mask;
  __u64 category_anyof_mask;
  __u64 return_mask;
};

#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#endif

static_assert(sizeof(struct pm_scan_arg) == 96, "pm_scan_arg is twelve __u64 in the kernel uAPI");
static_assert(sizeof(struct page_region) == 24, "page_region is three __u64 in the kernel uAPI");
