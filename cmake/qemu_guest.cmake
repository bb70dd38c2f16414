# The QEMU test guest (tests/qemu/guest): a 32-bit Multiboot ELF that checks its
# own RAM and device memory every pass. Both the QEMU tests (tests/qemu) and the
# QEMU benchmark (perf/qemu_hook.py, whose Release build has the tests off) run it,
# so its build lives here, included by both folders.
#
#   gm_qemu_guest(OUT_VAR)
#     The first call (in any folder) adds the target `qemu_guest` building
#     guest.elf in that folder's binary directory; later calls reuse it. OUT_VAR
#     is the ELF's path, or "" when the C compiler cannot emit freestanding -m32
#     code; then `qemu_guest` is an empty target (so `--target qemu_guest` still
#     builds) and whoever runs the guest skips.
#
# No multilib libc is involved: -ffreestanding makes <stdint.h> GCC's own header.
include_guard(GLOBAL)
include(CheckCSourceCompiles)

function(gm_qemu_guest out_var)
  get_property(done GLOBAL PROPERTY GM_QEMU_GUEST_DONE)
  if(done)
    get_property(elf GLOBAL PROPERTY GM_QEMU_GUEST_ELF)
    set(${out_var} "${elf}" PARENT_SCOPE)
    return()
  endif()

  set(gm_guest_cflags -m32 -march=i686 -ffreestanding -fno-pic -fno-stack-protector -O2 -Wall -Wextra)
  set(gm_guest_ldflags -m32 -nostdlib -static -no-pie -Wl,--build-id=none -Wl,-z,max-page-size=0x1000)
  set(CMAKE_REQUIRED_FLAGS "-m32 -march=i686 -ffreestanding -fno-pic -fno-stack-protector")
  set(CMAKE_REQUIRED_LINK_OPTIONS -nostdlib -static -no-pie)
  check_c_source_compiles("#include <stdint.h>
uint32_t gm_word;
void _start(void) { for (;;) ++gm_word; }" GPUMIGRATE_CC_M32_FREESTANDING)
  unset(CMAKE_REQUIRED_FLAGS)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)

  set(elf "")
  # GCC where installed, whatever compiles the rest (the clang ASan build): the
  # guest's code and boot.S have been run as GCC makes them.
  find_program(GPUMIGRATE_GUEST_CC gcc)
  set(gm_guest_cc ${CMAKE_C_COMPILER})
  if(GPUMIGRATE_GUEST_CC)
    set(gm_guest_cc ${GPUMIGRATE_GUEST_CC})
  endif()
  if(GPUMIGRATE_CC_M32_FREESTANDING)
    set(gm_guest ${PROJECT_SOURCE_DIR}/tests/qemu/guest)
    set(elf ${CMAKE_CURRENT_BINARY_DIR}/guest.elf)
    add_custom_command(OUTPUT ${elf}
      COMMAND ${gm_guest_cc} ${gm_guest_cflags} -c ${gm_guest}/boot.S -o guest-boot.o
      COMMAND ${gm_guest_cc} ${gm_guest_cflags} -c ${gm_guest}/kmain.c -o guest-kmain.o
      COMMAND ${gm_guest_cc} ${gm_guest_ldflags} -T ${gm_guest}/link.ld guest-boot.o guest-kmain.o -o ${elf}
      DEPENDS ${gm_guest}/boot.S ${gm_guest}/kmain.c ${gm_guest}/link.ld
      WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}
      COMMENT "QEMU test guest: 32-bit Multiboot ELF"
      VERBATIM)
    add_custom_target(qemu_guest ALL DEPENDS ${elf})
  else()
    message(STATUS "gpumigrate: ${CMAKE_C_COMPILER} cannot build freestanding -m32 code: the QEMU tests and "
                   "perf/run qemu_hook will skip")
    add_custom_target(qemu_guest)
  endif()
  set_property(GLOBAL PROPERTY GM_QEMU_GUEST_ELF "${elf}")
  set_property(GLOBAL PROPERTY GM_QEMU_GUEST_DONE TRUE)
  set(${out_var} "${elf}" PARENT_SCOPE)
endfunction()
